"""Reward scoring throughput: one call at a time vs a VerifierPool of 2 threads vs 2 processes.

    python benchmarks/bench_verifier_pool.py [--calls 400] [--repeats 3]

Three verifiers: the kinds the two pool kinds are for, and the cheapest rule:
- ``math_verify`` (CPU-bound pure Python: parse + symbolic equivalence): threads share the GIL, so
  only processes can use both cores;
- ``code_tests`` (a sandbox subprocess per call, the parent waits): threads suffice;
- ``exact_match`` (the default recipe's, microseconds a call): what the pool's machinery costs per call.
Completions alternate right and wrong answers. Each cell is the median of ``--repeats`` runs of
``--calls`` calls, interleaved (inline, thread, process, inline, ...); process workers are started
and warmed before timing (their ~2 s start-up is paid once per run, not per batch). Figures are
calls/s and the ratio to inline on this machine, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from reinforge.rewards.code import code_tests
from reinforge.rewards.math import math_verify_match
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import exact_match
from reinforge.types import Task

SOLUTION = "```python\ndef f(x):\n    return 2 * x\n```"
WRONG = "```python\ndef f(x):\n    return x\n```"


def math_case(i: int) -> tuple[Task, str]:
    a, b = 3 + i % 17, 5 + i % 11
    task = Task(f"m{i}", "p", f"\\frac{{{a}}}{{{b}}}")
    answer = f"\\frac{{{2 * a}}}{{{2 * b}}}" if i % 2 == 0 else f"{a / b + 0.5:.4f}"
    return task, f"so the answer is \\boxed{{{answer}}}"


def code_case(i: int) -> tuple[Task, str]:
    task = Task(f"c{i}", "p", "", {"asserts": "assert f(1) == 2\nassert f(3) == 6", "sandbox_limits": {"timeout_s": 5.0}})
    return task, SOLUTION if i % 2 == 0 else WRONG


def exact_case(i: int) -> tuple[Task, str]:
    return Task(f"e{i}", "p", str(i)), f"{i}" if i % 2 == 0 else f"{i + 1}"


def run_inline(verifier, cases) -> float:
    start = time.perf_counter()
    for task, completion in cases:
        verifier(task, completion)
    return len(cases) / (time.perf_counter() - start)


def run_pool(pool: VerifierPool, cases) -> float:
    start = time.perf_counter()
    outcomes = pool.score([t for t, _ in cases], [c for _, c in cases])
    assert all(o.status == "ok" for o in outcomes), [o.error for o in outcomes if o.status != "ok"][:3]
    return len(cases) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--code-calls", type=int, default=60)
    p.add_argument("--exact-calls", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.2f} at start, median of {args.repeats}")
    print("| verifier | calls | inline calls/s | 2 threads calls/s (x inline) | 2 processes calls/s (x inline) |")
    print("|---|---|---|---|---|")
    for name, verifier, make, n in (("math_verify", math_verify_match, math_case, args.calls),
                                    ("code_tests (sandbox)", code_tests, code_case, args.code_calls),
                                    ("exact_match", exact_match, exact_case, args.exact_calls)):
        cases = [make(i) for i in range(n)]
        with VerifierPool(verifier, workers=2, timeout_s=60) as threads, \
                VerifierPool(verifier, workers=2, timeout_s=60, kind="process") as procs:
            procs.wait_ready()
            run_pool(procs, cases[:8])  # warm the workers' imports and caches
            run_inline(verifier, cases[:8])
            results: dict[str, list[float]] = {"inline": [], "thread": [], "process": []}
            for _ in range(args.repeats):
                results["inline"].append(run_inline(verifier, cases))
                results["thread"].append(run_pool(threads, cases))
                results["process"].append(run_pool(procs, cases))
        med = {k: statistics.median(v) for k, v in results.items()}
        spread = {k: f"{min(v):.0f}-{max(v):.0f}" for k, v in results.items()}
        print(f"| {name} | {n} | {med['inline']:.0f} ({spread['inline']}) | {med['thread']:.0f} ({spread['thread']}) "
              f"x{med['thread'] / med['inline']:.2f} | {med['process']:.0f} ({spread['process']}) "
              f"x{med['process'] / med['inline']:.2f} |")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
