"""Agent RL when the environment takes time: steps/s with environment calls one at a time, concurrent
(synchronous RL), and concurrent under asynchronous RL, at several latencies per environment step.

    python benchmarks/bench_agent_latency.py [--latencies 0.05,0.2,1.0] [--steps 4] [--repeats 3] [--settings sequential,async]
    python benchmarks/bench_agent_latency.py --recipe agent_calculator --set env.max_tool_calls=2 ...

Every run trains ``--recipe`` (default: ``agent_calculator``, the shipped tiny-agent calling the
``calc`` tool) for ``--steps`` updates of ``--prompts`` x ``--group`` episodes (equal samples in
every setting), with the latency wrapper (``env.latency``: a fixed delay on every environment step,
on top of the environment's own time). Settings:

* ``sequential``: synchronous RL, ``env.concurrency=1`` (the environment calls of a turn one after another);
* ``concurrent``: synchronous RL, ``env.concurrency=64``;
* ``async``: ``orchestrate.mode=async`` with ``--workers`` rollout worker processes (each
  ``env.concurrency=64``), ``max_staleness`` ``--staleness``, in-flight weight updates.

Each run is a fresh subprocess; repeats are interleaved (every setting at every latency, then the
next repeat). steps/s is the steps after the first over the wall clock they took (``time/elapsed_s``; start-up
and the first batch excluded alike, no evaluation in between); medians over repeats with min-max, and the ratio to
``sequential`` of the same latency (medians of the per-repeat ratios).
"""

from __future__ import annotations

import argparse
import json
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
print("RESULT " + json.dumps(read_jsonl(result.run_dir / "metrics.jsonl")))
"""
SETTINGS = ("sequential", "concurrent", "async")


def overrides(setting: str, latency: float, args, workdir: Path, repeat: int) -> list[str]:
    out = [f"output_dir={workdir}", f"name={setting}-{latency}-{repeat}", f"seed={repeat}", f"train.steps={args.steps}",
           f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}", "eval.every=0",
           "eval.final_samples=0", "task.heldout_size=1", "checkpoint.every=0", "train.time_limit_s=0",
           "log.report=false", "log.samples_per_step=0",
           *([f"env.latency={{dist: fixed, mean_s: {latency}}}"] if latency > 0 else []),
           f"env.concurrency={1 if setting == 'sequential' else 64}", *args.set]
    if setting == "async":
        out += ["orchestrate.mode=async", f"orchestrate.rollout_workers={args.workers}",
                f"orchestrate.max_staleness={args.staleness}", "orchestrate.weight_update=inflight"]
    return out


def run(setting: str, latency: float, args, workdir: Path, repeat: int) -> dict:
    spec = {"recipe": args.recipe, "overrides": overrides(setting, latency, args, workdir, repeat)}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting} at {latency} s failed:\n{proc.stderr[-3000:]}")
    rows = [r for r in json.loads(proc.stdout.split("RESULT ", 1)[1]) if "time/step_s" in r]
    steps = rows[1:]
    return {"steps_per_s": len(steps) / (rows[-1]["time/elapsed_s"] - rows[0]["time/elapsed_s"]),
            "env_s": statistics.median(r["async/worker_env_s"] if "async/worker_env_s" in r else r.get("time/env_s", 0.0)
                                       for r in steps),  # async: the workers' waiting, hidden from the learner
            "env_calls": statistics.median(r.get("env/calls", 0.0) for r in steps)}


def _spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="agent_calculator")
    p.add_argument("--latencies", default="0.05,0.2,1.0", help="seconds added to every environment step "
                   "(0: no latency wrapper, the environment's own time only, e.g. the sandbox's for agent_code)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="async: rollout worker processes")
    p.add_argument("--staleness", type=int, default=2)
    p.add_argument("--settings", default=",".join(SETTINGS), help="which settings to run, comma-separated "
                   "(sequential is the baseline of the ratios and always runs)")
    p.add_argument("--set", action="append", default=[], help="an override for every run (key=value)")
    args = p.parse_args()
    latencies = [float(x) for x in args.latencies.split(",")]
    unknown = set(args.settings.split(",")) - set(SETTINGS)
    if unknown:
        p.error(f"--settings: unknown {sorted(unknown)}; choose from {', '.join(SETTINGS)}")
    settings = [s for s in SETTINGS if s in args.settings.split(",") or s == SETTINGS[0]]
    results: dict[tuple[str, float], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for latency in latencies:
                for setting in settings:
                    r = run(setting, latency, args, Path(tmp), repeat)
                    results.setdefault((setting, latency), []).append(r)
                    print(f"repeat {repeat} latency {latency} {setting}: {r['steps_per_s']:.3f} steps/s "
                          f"(env wait {r['env_s']:.2f} s/step, {r['env_calls']:.0f} calls/step)", flush=True)
    print(f"\n{args.prompts} prompts x {args.group} episodes per step, {args.steps} steps, {args.repeats} repeats\n")
    print("| latency per step | setting | steps/s | x sequential | env wait s/step (async: in the workers) |")
    print("|---|---|---|---|---|")
    for latency in latencies:
        base = [r["steps_per_s"] for r in results["sequential", latency]]
        for setting in settings:
            runs = results[setting, latency]
            ratios = [r["steps_per_s"] / b for r, b in zip(runs, base, strict=True)]
            print(f"| {latency * 1000:.0f} ms | {setting} | {_spread([r['steps_per_s'] for r in runs])} | "
                  f"{_spread(ratios, 2)} | {_spread([r['env_s'] for r in runs], 2)} |")


if __name__ == "__main__":
    main()
