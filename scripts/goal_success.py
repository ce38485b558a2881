"""Success rates of classic runs on a sparse-reward goal task (reward -1 a step until the goal is reached,
0 on it; docs/classic.md, "Goal-conditioned"): an episode reached its goal when its return is above
-horizon. For each run directory: the share of its greedy evaluation episodes (eval.json) that end on
their goal (``eval/success_rate``), the share that reached it at some step, their mean return, and the share of its training episodes that did in consecutive windows of env steps
(metrics.jsonl, one record per update with the mean return of the episodes that ended in it: one
environment, so one episode per record).

    python scripts/goal_success.py runs/reacher-her-0 runs/reacher-plain-0 --horizon 50 --window 3000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def training_success(run_dir: Path, horizon: int, window: int) -> list[float]:
    """The share of training episodes with a return above -horizon, per window of ``window`` env steps."""
    steps, reached = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "episode/return_mean" in record:
            steps.append(record["env_steps"])
            reached.append(record["episode/return_mean"] > -horizon)
    steps_a, reached_a = np.array(steps), np.array(reached, dtype=float)
    last = int(steps_a.max()) if steps else 0
    shares = []
    for start in range(0, last, window):
        inside = (steps_a > start) & (steps_a <= start + window)
        shares.append(float(reached_a[inside].mean()) if inside.any() else float("nan"))
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--horizon", type=int, default=50, help="episode length: a return above -horizon reached")
    parser.add_argument("--window", type=int, default=3000, help="env steps per training window")
    args = parser.parse_args()
    for run_dir in args.runs:
        result = json.loads((run_dir / "eval.json").read_text())
        returns = np.array(result["returns"])
        success = f"{result['eval/success_rate']:4.0%}" if "eval/success_rate" in result else "   -"
        train = " ".join(f"{share:4.0%}" for share in training_success(run_dir, args.horizon, args.window))
        print(f"{run_dir.name}: eval ends on goal {success}, reached {np.mean(returns > -args.horizon):4.0%} "
              f"of {returns.size}, "
              f"mean return {returns.mean():6.1f} | training reached per {args.window} steps: {train}")


if __name__ == "__main__":
    main()
