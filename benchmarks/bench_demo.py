"""The default recipe's time to accuracy: ``reinforge train`` (what ``make demo`` runs) over several seeds.

    python benchmarks/bench_demo.py [--seeds 0,1,2] [--target 0.9] [--set train.lr=2e-4 ...] [--baseline-tree DIR] \\
        [--compare "train.lr=1e-4 train.steps=1400" ...] [--out /tmp/bench-demo]

Each (arm, seed) is one ``reinforge train`` in a fresh subprocess, the arms interleaved seed by seed
(arm A seed 0, arm B seed 0, arm A seed 1, ...), so a change in the machine's load falls on both.
The default arm is the shipped ``default`` recipe as it stands, plus ``--set``; each ``--compare`` adds an
arm, the default recipe plus its overrides; ``--baseline-tree`` adds the default recipe of another checkout run
with that checkout's code (a code change measured against the code before it, in the same machine state). Per run, from ``metrics.jsonl``:

- ``time_to_target_s``: the run's clock (``time/elapsed_s``: from the start of the run, the evaluation
  before training included) at the first held-out evaluation with greedy accuracy >= ``--target``;
  ``step_to_target`` that evaluation's step (``None``: never reached);
- ``final``: the held-out greedy accuracy after the last step; ``total_s`` the run's clock at the end;
- the median step split into generation, reward and learner time, and ``outside_steps_s``: the run's
  clock minus the sum of its step times (the evaluations, checkpoints and the start-up).

The 1-minute load average is recorded before and after each run: read figures taken under load
(> 0.5 on 2 cores) as such. Every arm gets the median and range over its seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(overrides: list[str], seed: int, out: Path, tree: Path = REPO) -> Path:
    """One ``reinforge train`` with ``overrides``, the package and recipes of checkout ``tree``; returns its run
    directory."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "reinforge.cli", "train", f"output_dir={out}", f"seed={seed}", *overrides]
    log = out / "train.log"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    with log.open("w") as fh:
        code = subprocess.call(cmd, cwd=tree, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if code != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {code}; see {log}")
    runs = sorted(p.parent for p in out.glob("*/metrics.jsonl"))
    if not runs:
        raise RuntimeError(f"no metrics.jsonl under {out}; see {log}")
    return runs[-1]


def summarise(run_dir: Path, target: float) -> dict:
    """Time and step to ``target``, the final accuracy and the step split of one run's ``metrics.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    steps = [r for r in rows if "time/step_s" in r]
    clock = {r["step"]: r["time/elapsed_s"] for r in steps}
    evals = [(r["step"], r["eval/heldout_acc"]) for r in rows if "eval/heldout_acc" in r]
    hit = next(((s, a) for s, a in evals if a >= target and s > 0), None)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in steps)

    total = steps[-1]["time/elapsed_s"]
    return {
        "step_to_target": hit[0] if hit else None,
        "time_to_target_s": clock.get(hit[0]) if hit else None,
        "final": evals[-1][1], "before": evals[0][1], "steps": len(steps), "total_s": total,
        "step_s": median("time/step_s"), "generate_s": median("time/generate_s"),
        "reward_s": median("time/reward_s"), "train_s": median("time/train_s"),
        "outside_steps_s": total - sum(r["time/step_s"] for r in steps),
    }


def spread(values: list[float]) -> str:
    """``median (min-max)``, or what was reached where some runs never got there."""
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"

    def fmt(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:.3g}"

    text = f"{fmt(statistics.median(got))} ({fmt(min(got))}-{fmt(max(got))})"
    return text if len(got) == len(values) else f"{text}, {len(values) - len(got)} not reached"


def table(results: dict[str, list[dict]], target: float) -> str:
    """A markdown table, one row per arm."""
    head = (f"| arm | time to {target} (s) | step to {target} | final | median step (s): generate / reward / "
            "learner | outside the steps (s) | load1 |")
    lines = [head, "|" + "---|" * 7]
    for arm, runs in results.items():
        split = " / ".join(f"{statistics.median(r[k] for r in runs):.3f}" for k in ("generate_s", "reward_s",
                                                                                  "train_s"))
        loads = [x for r in runs for x in r["load1"]]
        lines.append(f"| {arm} | {spread([r['time_to_target_s'] for r in runs])} | "
                     f"{spread([r['step_to_target'] for r in runs])} | {spread([r['final'] for r in runs])} | "
                     f"{statistics.median(r['step_s'] for r in runs):.3f}: {split} | "
                     f"{spread([r['outside_steps_s'] for r in runs])} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--set", nargs="*", default=[], help="overrides of the default arm")
    p.add_argument("--compare", action="append", default=[],
                   help="another arm: overrides, one string (repeat for more arms; \"\" is the default recipe)")
    p.add_argument("--baseline-tree", type=Path, default=None,
                   help="another checkout (e.g. `git worktree add /tmp/base REV`): one more arm, its default recipe "
                        "run with its own code, interleaved with the others")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-demo"))
    args = p.parse_args()
    arms = {"default" + (" " + " ".join(args.set) if args.set else ""): (args.set, REPO)}
    for overrides in args.compare:
        arms[overrides or "default"] = (shlex.split(overrides), REPO)
    if args.baseline_tree:
        arms[f"the default recipe at {args.baseline_tree}"] = ([], args.baseline_tree.resolve())
    results: dict[str, list[dict]] = {arm: [] for arm in arms}
    for seed in (int(s) for s in args.seeds.split(",")):
        for index, (arm, (overrides, tree)) in enumerate(arms.items()):
            load_before, start = os.getloadavg()[0], time.perf_counter()
            run_dir = run_once(overrides, seed, args.out / f"arm{index}-seed{seed}", tree)
            row = summarise(run_dir, args.target) | {"seed": seed, "run_dir": str(run_dir),
                                                     "wall_s": time.perf_counter() - start,
                                                     "load1": [load_before, os.getloadavg()[0]]}
            results[arm].append(row)
            print(f"{arm} seed {seed}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                       for k, v in row.items() if k != "run_dir"), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results, args.target))


if __name__ == "__main__":
    main()
