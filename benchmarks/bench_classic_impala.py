"""IMPALA's actor-learner throughput on this machine: environment steps per second with the unrolls made
in the learner's process (``actors 0``) or by 1..N Ray actor processes.

    python benchmarks/bench_classic_impala.py [--actors 0,1,2,3] [--updates 200] [--warmup 20] [--repeats 3]

Each setting builds the ``cartpole_impala`` recipe's agent (4 CartPole environments per actor or in
process, unrolls of 32 steps, one gradient step per unroll) in a fresh subprocess (Ray starts outside
the timing), takes ``--warmup`` iterations, then times ``--updates`` iterations: environment steps
consumed by the learner per second and updates per second (max_staleness is raised so no unroll is
dropped: every unroll is trained on). Repeats are interleaved (0, 1, 2, ..., 0, 1, ...); medians with
the min-max spread, and the ratio to ``actors 0`` (median of per-repeat ratios).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import torch
from reinforge.classic.config import load_classic_config
from reinforge.classic.envs import make_vec_env
from reinforge.classic.impala import Impala
actors, updates, warmup = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(1)
cfg = load_classic_config("cartpole_impala", [f"classic.agent.actors={actors}", "classic.agent.max_staleness=1000000"])
c = cfg.classic
envs = make_vec_env(c.env, c.agent.settings.gamma, 0)
agent = Impala(envs, 0, c.agent.settings, c.env)
for i in range(warmup):
    agent.iterate(0.0)
t0 = time.perf_counter()
lags = []
for i in range(updates):
    lags.append(agent.iterate(0.0).metrics["async/lag_mean"])
elapsed = time.perf_counter() - t0
agent.close()
print("RESULT " + json.dumps({"steps_per_s": updates * agent.steps_per_iteration / elapsed,
                              "updates_per_s": updates / elapsed, "lag_mean": sum(lags) / len(lags)}))
"""


def run(actors: int, updates: int, warmup: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(actors), str(updates), str(warmup)], capture_output=True,
                         text=True, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"actors={actors} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--actors", default="0,1,2,3")
    p.add_argument("--updates", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    settings = [int(a) for a in args.actors.split(",")]
    results: dict[int, list[dict]] = {a: [] for a in settings}
    for r in range(args.repeats):
        for a in settings:
            results[a].append(run(a, args.updates, args.warmup))
            print(f"repeat {r} actors {a}: {results[a][-1]}", flush=True)
    base = settings[0]
    print(f"\n| actors | env steps/s | updates/s | x actors {base} | mean lag (updates) |\n|---|---|---|---|---|")
    for a in settings:
        sps = [x["steps_per_s"] for x in results[a]]
        ups = [x["updates_per_s"] for x in results[a]]
        ratio = statistics.median(x["steps_per_s"] / b["steps_per_s"] for x, b in zip(results[a], results[base],
                                                                                        strict=True))
        print(f"| {a} | {statistics.median(sps):.0f} ({min(sps):.0f}-{max(sps):.0f}) | {statistics.median(ups):.1f} "
              f"| {ratio:.2f} | {statistics.median(x['lag_mean'] for x in results[a]):.2f} |")


if __name__ == "__main__":
    main()
