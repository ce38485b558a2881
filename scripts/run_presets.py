"""Every algorithm preset (and any whole-algorithm recipe given) on the built-in task, several seeds
each, the same steps and batch shape for all: final held-out greedy accuracy with bootstrap
intervals over seeds, wall-clock, and `reinforge compare` across them (IQM, probability of
improvement). Its output is the table in docs/measurements/presets.md ("What each preset reaches here").

    .venv/bin/python scripts/run_presets.py [--steps 100] [--seeds 3] [--out runs/presets]
        [--only grpo,dapo] [--recipe path/to/recipe.yaml ...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from reinforge.config import load_config, load_preset, preset_names
from reinforge.eval.compare import compare_runs, format_table
from reinforge.eval.runs import load_run
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl

LEARNING_RATE = {"remax": 5e-5}  # as tests/test_presets_e2e.py: remax is unstable at 1e-4 on this task
HELDOUT = 300


def _learning_rate(args: argparse.Namespace, name: str) -> list[str]:
    """``--lr`` if given, else as tests/test_presets_e2e.py: the preset's own (the presets with several
    mini-batches set 2.5e-5) or the default recipe's 1e-4, and 5e-5 for remax."""
    lr = args.lr or LEARNING_RATE.get(name)
    return [f"train.lr={lr}"] if lr else []


def _batch_shape(name: str) -> list[str]:
    """16 prompts x 8 samples, unless the preset sets its own batch shape (A*-PO: 128 prompts x 1 sample,
    the same samples per step)."""
    own = load_preset(name).get("rollout", {}) if name in preset_names() else {}
    return [f"rollout.{k}={v}" for k, v in (("prompts_per_step", 16), ("group_size", 8)) if k not in own]


def _overrides(args: argparse.Namespace, name: str, seed: int) -> list[str]:
    return [
        f"output_dir={args.out}", f"name={name}-s{seed}", f"seed={seed}", f"train.steps={args.steps}",
        *_learning_rate(args, name), "train.lr_schedule=constant", "train.time_limit_s=0",
        *_batch_shape(name), f"task.heldout_size={HELDOUT}", "eval.every=0",
        "checkpoint.every=0", "log.samples_per_step=0", "eval.final_samples=0", "log.report=false",
        *args.set,
    ]


def run_one(args: argparse.Namespace, name: str, recipe: str | None, seed: int) -> dict:
    """One run; its final held-out greedy accuracy, generated samples and wall-clock."""
    preset = [] if recipe else [f"preset={name}"]
    cfg = load_config(recipe, [*preset, *_overrides(args, name, seed)])
    start = time.perf_counter()
    result = train(cfg)
    wall = time.perf_counter() - start
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    samples = sum(m["rollout/sampled"] for m in rows)
    reference = rows[-1].get("value_estimates/reference_samples", 0.0) if rows else 0.0  # A*-PO's stage 1
    return {"dir": str(result.run_dir), "after": result.heldout_after, "before": result.heldout_before,
            "wall": wall, "samples": samples, "reference": reference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr", type=float, default=None, help="default: as tests/test_presets_e2e.py")
    parser.add_argument("--only", default="", help="comma-separated preset names (default: every preset)")
    parser.add_argument("--recipe", action="append", default=[], help="a whole-algorithm recipe to add (repeat)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every run, after the script's own (repeat)")
    parser.add_argument("--out", default=None, help="run directory root (default: a temporary directory)")
    args = parser.parse_args()
    args.out = args.out or tempfile.mkdtemp(prefix="reinforge-presets-")
    names = [n for n in args.only.split(",") if n] or list(preset_names())
    algos = [(n, None) for n in names] + [(Path(r).stem, r) for r in args.recipe]
    runs: dict[str, list[dict]] = {}
    for seed in range(args.seeds):  # seeds outermost: a slow spell of the machine hits every algorithm alike
        for name, recipe in algos:
            runs.setdefault(name, []).append(run_one(args, name, recipe, seed))
            r = runs[name][-1]
            print(f"{name} seed {seed}: {r['before']:.3f} -> {r['after']:.3f} in {r['wall']:.0f} s", flush=True)
    groups = {name: [load_run(r["dir"]) for r in rs] for name, rs in runs.items()}
    result = compare_runs(groups)
    print(f"\n{args.steps} steps x 16 prompts x 8 samples (or the preset's own shape), {args.seeds} seeds, held-out {HELDOUT} prompts, runs in {args.out}\n")
    print("| algorithm | held-out greedy after, mean over seeds [95% CI] | per seed | samples generated / run | wall-clock / run (s) |")
    print("|---|---|---|---|---|")
    for name, rs in runs.items():
        seeds = ", ".join(f"{r['after']:.3f}" for r in rs)
        ci = result.groups[name].estimates["mean"]
        print(f"| {name} | {ci} | {seeds} | {statistics.median(r['samples'] for r in rs):.0f} "
              f"| {statistics.median(r['wall'] for r in rs):.0f} |")
    for name, rs in runs.items():
        if any(r["reference"] for r in rs):
            print(f"\n{name}: besides, {statistics.median(r['reference'] for r in rs):.0f} samples of the reference "
                  "policy / run to estimate V* (stage 1)")
    print()
    print(format_table(result))


if __name__ == "__main__":
    main()
