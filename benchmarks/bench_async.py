"""Synchronous vs asynchronous RL on the built-in task: wall-clock to a held-out accuracy target,
and held-out accuracy after equal samples.

    python benchmarks/bench_async.py [--steps 150] [--repeats 3] [--target 0.5] [--staleness 1,2,4]
    python benchmarks/bench_async.py --recipe agent_guessing --steps 60 --heldout 192 --target 0.45

``--recipe`` trains another recipe (e.g. a multi-turn agent recipe, where generation is about half
of a synchronous step) with the same settings; ``--set key=value`` adds overrides to every run.

Each setting trains the shipped tiny base with the default recipe's algorithm for ``--steps``
updates of 16 prompts x 8 samples (equal samples for every setting), evaluating held-out greedy
accuracy every ``--eval-every`` updates. Settings: ``sync`` (one process, 2 torch threads) and
``async s=K`` (one rollout worker process with ``--rollout-threads`` (1), the learner with
``--learner-threads`` (1), max_staleness K, in-flight weight updates). Each run is a fresh subprocess; repeats are
interleaved (sync, s=1, s=2, ..., sync, ...). Wall-clock counts the training steps only (the sum
of ``time/step_s``; the held-out evaluations are excluded for every setting alike). "to target"
is the wall-clock at the first evaluation reaching ``--target``. Medians over repeats with the
min-max spread; the speed-up is sync's median over the setting's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys
from reinforge.config import load_config
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
spec = json.loads(sys.argv[1])
result = train(load_config(spec["recipe"], spec["overrides"]), progress_every=10**6)
rows = read_jsonl(result.run_dir / "metrics.jsonl")
print("RESULT " + json.dumps(rows))
"""


def run(setting: str, args, workdir: Path, repeat: int) -> dict:
    overrides = [
        f"output_dir={workdir}", f"name={setting.replace(' ', '_').replace('=', '')}-{repeat}", f"seed={repeat}",
        f"train.steps={args.steps}", f"eval.every={args.eval_every}", "eval.final_samples=0", "checkpoint.every=0",
        "train.time_limit_s=0", "log.report=false", "log.samples_per_step=0", f"task.heldout_size={args.heldout}",
        "train.lr_schedule=constant", *args.set,
    ]
    if setting != "sync":
        overrides += ["orchestrate.mode=async", f"orchestrate.max_staleness={setting.split('=')[1]}",
                      "orchestrate.weight_update=inflight", f"orchestrate.learner_threads={args.learner_threads}",
                      f"orchestrate.rollout_threads={args.rollout_threads}"]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"recipe": args.recipe, "overrides": overrides})], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting} failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.split("RESULT ", 1)[1])
    elapsed, to_target, last_acc = 0.0, None, None
    for m in rows:
        if "time/step_s" in m:
            elapsed += m["time/step_s"]
        if "eval/heldout_acc" in m and m.get("step", 0) > 0:
            last_acc = m["eval/heldout_acc"]
            if to_target is None and last_acc >= args.target:
                to_target = elapsed
    return {"wall_s": elapsed, "to_target_s": to_target, "final_acc": last_acc,
            "start_acc": next(m["eval/heldout_acc"] for m in rows if m.get("step") == 0)}


def summary(results: dict[str, list[dict]]) -> dict:
    """Every run, and each async setting's speed-up over sync (median train wall-clock over median)."""
    base = statistics.median(r["wall_s"] for r in results["sync"])
    return {"cpu_count": os.cpu_count(), "runs": results,
            "speedup": {s: base / statistics.median(r["wall_s"] for r in rs) for s, rs in results.items() if s != "sync"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="recipe name or path (default: the default recipe)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--staleness", default="1,2,4")
    p.add_argument("--learner-threads", type=int, default=1, help="async: torch threads of the learner")
    p.add_argument("--rollout-threads", type=int, default=1, help="async: torch threads of the rollout worker")
    p.add_argument("--json", type=Path, default=None, help="also write every run's figures and the speed-ups here")
    args = p.parse_args()
    settings = ["sync"] + [f"async s={s}" for s in args.staleness.split(",")]
    results: dict[str, list[dict]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for setting in settings:
                results[setting].append(run(setting, args, Path(tmp), repeat))
                r = results[setting][-1]
                print(f"# {setting} repeat {repeat}: {json.dumps(r)}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(summary(results), indent=1))
    print(f"{os.cpu_count()} CPU cores; recipe {args.recipe or 'default'}; {args.steps} updates; target held-out greedy accuracy "
          f"{args.target}; async: learner {args.learner_threads} thread(s), rollout worker "
          f"{args.rollout_threads}; median (min-max) of {args.repeats}")
    print("| setting | train wall-clock s | speed-up | to target s | speed-up to target | final held-out acc |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(r["wall_s"] for r in results["sync"])
    base_t = [r["to_target_s"] for r in results["sync"] if r["to_target_s"] is not None]
    for setting, rs in results.items():
        wall = [r["wall_s"] for r in rs]
        hits = [r["to_target_s"] for r in rs if r["to_target_s"] is not None]
        acc = [r["final_acc"] for r in rs]
        t = f"{statistics.median(hits):.1f} ({min(hits):.1f}-{max(hits):.1f}), {len(hits)}/{len(rs)} hit" if hits \
            else f"not reached (0/{len(rs)})"
        speed_t = f"{statistics.median(base_t) / statistics.median(hits):.2f}x" if hits and base_t else "-"
        print(f"| {setting} | {statistics.median(wall):.1f} ({min(wall):.1f}-{max(wall):.1f}) | "
              f"{base / statistics.median(wall):.2f}x | {t} | {speed_t} | "
              f"{statistics.median(acc):.3f} ({min(acc):.3f}-{max(acc):.3f}) |")


if __name__ == "__main__":
    main()
