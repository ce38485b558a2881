"""Soak: the default recipe for 2,000 steps; resident memory and step time every 100 steps.

    python benchmarks/bench_soak.py [--steps 2000] [--every 100] [--out runs/soak]

The run is the shipped default recipe (GRPO on the built-in addition task, evaluations every 25
steps, checkpoints every 100) with ``train.steps`` raised to ``--steps`` (its cosine schedule
stretched to match) and without the end-of-run pass@k evaluation. After every step the process's
resident set (``/proc/self/statm``) is read; every ``--every`` steps the table gets a row: RSS now,
and the median step time of the steps since the last row. The last line compares the final RSS
with the RSS at step 200 (after warm-up: allocator pools, caches and the first checkpoint exist):
a leak shows as steady growth; the issue's bound is 10%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--out", default=None, help="run directory root (default: a temporary directory)")
    args = parser.parse_args()

    from reinforge.config import load_config
    from reinforge.orchestrate.loop import Loop
    from reinforge.orchestrate.run import train

    rows: list[tuple[int, float, float]] = []
    times: list[float] = []
    step_fn = Loop.train_step

    def measured_step(self, step: int):
        t0 = time.perf_counter()
        metrics = step_fn(self, step)
        times.append(time.perf_counter() - t0)
        if step % args.every == 0 or step == args.steps:
            rows.append((step, rss_mb(), statistics.median(times)))
            times.clear()
        return metrics

    Loop.train_step = measured_step
    out = args.out or tempfile.mkdtemp(prefix="reinforge-soak-")
    cfg = load_config(None, [f"output_dir={out}", f"train.steps={args.steps}", "eval.final_samples=0",
                             "train.time_limit_s=0", "log.report=false"])
    start = time.perf_counter()
    train(cfg)
    wall = time.perf_counter() - start
    print(f"\n{args.steps} steps of the default recipe in {wall:.0f} s ({out})\n")
    print("| step | RSS (MB) | median step time since the last row (s) |")
    print("|---:|---:|---:|")
    for step, rss, t in rows:
        print(f"| {step} | {rss:.0f} | {t:.3f} |")
    ref = next((rss for step, rss, _ in rows if step >= min(200, args.steps)), rows[0][1])
    final = rows[-1][1]
    print(f"\nRSS at the end {final:.0f} MB vs {ref:.0f} MB at step {min(200, args.steps)}: "
          f"{100 * (final / ref - 1):+.1f}% (bound: within 10%)")


if __name__ == "__main__":
    main()
