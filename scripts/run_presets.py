"""Run every algorithm preset on the built-in task with the settings of tests/test_presets_e2e.py
and print a markdown table of what each reached (recorded in docs/algorithms.md).

    .venv/bin/python scripts/run_presets.py [--steps 40] [--out /tmp/presets]
"""

from __future__ import annotations

import argparse
import tempfile

from reinforge.config import load_config, preset_names
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

LEARNING_RATE = {"remax": 5e-5}  # as tests/test_presets_e2e.py: remax is unstable at 1e-4 on this task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=None, help="default: as tests/test_presets_e2e.py")
    parser.add_argument("--out", default=None, help="run directory root (default: a temporary directory)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="reinforge-presets-")
    print("| preset | held-out greedy before -> after | reward, first 10 -> last 10 steps | s/step |")
    print("|---|---|---|---|")
    for name in preset_names():
        cfg = load_config(None, [
            f"preset={name}", f"output_dir={out}", f"name={name}", f"train.steps={args.steps}", f"train.lr={args.lr or LEARNING_RATE.get(name, 1e-4)}",
            "train.lr_schedule=constant", "train.time_limit_s=0", "rollout.prompts_per_step=16",
            "rollout.group_size=8", "task.heldout_size=300", "eval.every=0", "checkpoint.every=0",
            "log.samples_per_step=0",
        ])
        result = train(cfg)
        rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
        first = sum(m["reward/mean"] for m in rows[:10]) / 10
        last = sum(m["reward/mean"] for m in rows[-10:]) / 10
        per_step = sum(m["time/step_s"] for m in rows) / len(rows)
        print(f"| {name} | {result.heldout_before:.3f} -> {result.heldout_after:.3f} | {first:.3f} -> {last:.3f} "
              f"| {per_step:.2f} |", flush=True)


if __name__ == "__main__":
    main()
