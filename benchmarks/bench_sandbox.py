"""Sandbox throughput: executions per second per isolation backend, sequential and with 2 workers.

    python benchmarks/bench_sandbox.py [--runs 40] [--backends bubblewrap,unshare,rlimits-only]

Two programs: a trivial one (``print(1)``) and a small test suite (a solution plus 10 assert
cases through the code verifier's harness, one sandbox run). "2 workers" runs the same count
through a 2-thread ``VerifierPool``-style executor, the way the trainer scores completions.
Each figure is the wall time of all runs after one warm-up run; the machine has 2 cores, so
other processes running at the same time lower the figures.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from reinforge.rewards.code import run_tests
from reinforge.sandbox import SandboxLimits, available_backends, run_python

LIMITS = SandboxLimits(timeout_s=10.0)
SOLUTION = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = "\n".join(f"assert fib({n}) == {v}" for n, v in enumerate([0, 1, 1, 2, 3, 5, 8, 13, 21, 34]))


def trivial(backend: str) -> None:
    result = run_python("print(1)", limits=LIMITS, backend=backend)  # type: ignore[arg-type]
    assert result.ok and result.stdout == "1\n", result


def suite(backend: str) -> None:
    result = run_tests(SOLUTION, asserts=TESTS, limits=LIMITS, backend=backend)  # type: ignore[arg-type]
    assert result.reward == 1.0, result


def throughput(job: Callable[[str], None], backend: str, runs: int, workers: int) -> float:
    job(backend)  # warm-up
    start = time.perf_counter()
    if workers == 1:
        for _ in range(runs):
            job(backend)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(job, [backend] * runs))
    return runs / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--backends", default=",".join(available_backends()))
    args = p.parse_args()
    print(f"{os.cpu_count()} CPU cores, running as {'root' if os.geteuid() == 0 else 'uid ' + str(os.geteuid())}, "
          f"{args.runs} runs per cell")
    print("| backend | program | sequential exec/s | 2 workers exec/s |\n|---|---|---|---|")
    for backend in args.backends.split(","):
        for name, job in (("trivial `print(1)`", trivial), ("solution + 10 asserts", suite)):
            seq = throughput(job, backend, args.runs, 1)
            par = throughput(job, backend, args.runs, 2)
            print(f"| {backend} | {name} | {seq:.1f} | {par:.1f} |", flush=True)


if __name__ == "__main__":
    main()
