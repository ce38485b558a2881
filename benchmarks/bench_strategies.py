"""Rollout strategies against plain GRPO at equal samples: tokens generated and wall-clock to a held-out
accuracy target on the built-in task.

    python benchmarks/bench_strategies.py [--steps 60] [--repeats 3] [--target 0.5] [--set task.digits=1]
    python benchmarks/bench_strategies.py --strategy 'replay=<override>' --strategy 'replay=<another>'
    python benchmarks/bench_strategies.py --micro 7      # the samplers alone, seconds per call

Strategies: ``grpo`` (independent samples), ``spec_rl`` (``rollout.group_sampler={name: spec_rl}``),
``treepo`` (``rollout.group_sampler={name: treepo, ...}`` with ``algo.advantage=treepo``); ``--only``
picks some; ``--strategy NAME=KEY=VALUE`` adds a strategy (or an override to one; repeat it for
several), e.g. a replay strategy selected by its recipe override. ``--set KEY=VALUE`` goes to every run.

Every run trains the default recipe (the shipped tiny base, GRPO, 16 prompts x 8 samples a step) for
``--steps`` updates (equal samples for every strategy), evaluating held-out greedy accuracy every
``--eval-every`` updates, in a fresh subprocess; repeats are interleaved (grpo, spec_rl, treepo, grpo,
...). Tokens generated: the sum of ``rollout/tokens_generated`` (what the engine decoded; reused
tokens are counted apart in ``rollout/tokens_reused``). Wall-clock: the sum of ``time/step_s``
(evaluations excluded alike). "to target": tokens and seconds at the first evaluation reaching
``--target``. Medians (min-max) over repeats; ratios are grpo's median over the strategy's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys
from reinforge.config import load_config
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
spec = json.loads(sys.argv[1])
result = train(load_config(None, spec["overrides"]), progress_every=10**6)
print("RESULT " + json.dumps(read_jsonl(result.run_dir / "metrics.jsonl")))
"""

STRATEGIES = {
    "grpo": [],
    "spec_rl": ["rollout.group_sampler={name: spec_rl}"],
    "treepo": ["rollout.group_sampler={name: treepo, segment_len: 2}", "algo.advantage=treepo"],
}


def run(name: str, overrides: list[str], args, workdir: Path, repeat: int) -> dict:
    common = [
        f"output_dir={workdir}", f"name={name}-{repeat}", f"seed={repeat}", f"train.steps={args.steps}",
        f"eval.every={args.eval_every}", "eval.final_samples=0", "checkpoint.every=0", "train.time_limit_s=0",
        "log.report=false", "log.samples_per_step=0", f"task.heldout_size={args.heldout}",
        "train.lr_schedule=constant", *args.set, *overrides,
    ]
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps({"overrides": common})], capture_output=True,
                          text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return summarise(json.loads(proc.stdout.split("RESULT ", 1)[1]), args.target)


def summarise(rows: list[dict], target: float) -> dict:
    """Totals and the first evaluation at or above ``target`` from one run's metrics records."""
    wall = tokens = reused = 0.0
    hit: tuple[float, float] | None = None
    last = None
    for m in rows:
        wall += m.get("time/step_s", 0.0)
        tokens += m.get("rollout/tokens_generated", 0.0)
        reused += m.get("rollout/tokens_reused", 0.0)
        if "eval/heldout_acc" in m and m.get("step", 0) > 0:
            last = m["eval/heldout_acc"]
            if hit is None and last >= target:
                hit = (tokens, wall)
    start = next(m["eval/heldout_acc"] for m in rows if m.get("step") == 0)
    return {"wall_s": wall, "tokens": tokens, "reused": reused, "hit": hit, "final_acc": last, "start_acc": start}


def _med(xs: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def table(results: dict[str, list[dict]]) -> list[str]:
    lines = ["| strategy | tokens generated | x grpo | tokens reused | train wall-clock s | x grpo | "
             "to target: tokens / s | final held-out acc |", "|---|---|---|---|---|---|---|---|"]
    base = results.get("grpo") or next(iter(results.values()))
    base_tok, base_wall = (statistics.median(r[k] for r in base) for k in ("tokens", "wall_s"))
    for name, rs in results.items():
        tok, wall = [r["tokens"] for r in rs], [r["wall_s"] for r in rs]
        hits = [r["hit"] for r in rs if r["hit"] is not None]
        target = (f"{statistics.median(h[0] for h in hits):.0f} / {statistics.median(h[1] for h in hits):.1f}, "
                  f"{len(hits)}/{len(rs)} hit") if hits else f"not reached (0/{len(rs)})"
        lines.append(f"| {name} | {_med(tok)} | {base_tok / max(statistics.median(tok), 1):.2f}x | "
                     f"{_med([r['reused'] for r in rs])} | {_med(wall, '{:.1f}')} | "
                     f"{base_wall / statistics.median(wall):.2f}x | {target} | "
                     f"{_med([r['final_acc'] for r in rs], '{:.3f}')} |")
    return lines


def strategies(args) -> dict[str, list[str]]:
    chosen = {k: list(v) for k, v in STRATEGIES.items() if not args.only or k in args.only.split(",")}
    for spec in args.strategy:
        name, _, override = spec.partition("=")
        chosen.setdefault(name, [])
        if override:
            chosen[name].append(override)
    return chosen


def micro(repeats: int) -> list[str]:
    """Seconds per group-sampling call on the shipped tiny base (16 prompts x 8 samples, 8 new tokens, one
    torch thread), interleaved repeats; ``spec_rl (drafts)`` samples again right after a call of its own,
    so every draft comes from the same policy (its best case: nothing is rejected)."""
    import torch

    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.parts import all_kinds
    from reinforge.rollout.group_samplers import build_group_sampler
    from reinforge.rollout.torch_engine import TorchRolloutEngine
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    torch.set_num_threads(1)
    all_kinds()
    tok = load_tokenizer("tiny-base")
    engine = TorchRolloutEngine(load_model("tiny-base"), tok, seed=0)
    reqs = [GenerationRequest(tok.encode(f"{a}+{a + 7}="), f"r{a}") for a in range(10, 26)]
    params = SamplingParams(max_new_tokens=8, n=8)
    samplers = {"grpo (independent)": build_group_sampler("independent"), "spec_rl (no drafts)": None,
                "spec_rl (drafts)": build_group_sampler("spec_rl"), "treepo": build_group_sampler("treepo")}
    times: dict[str, list[float]] = {k: [] for k in samplers}
    counts: dict[str, dict[str, float]] = {}
    for _ in range(repeats):
        for name, sampler in samplers.items():
            if sampler is None:  # a fresh SPEC-RL: its first epoch
                sampler = build_group_sampler("spec_rl")
            t0 = time.perf_counter()
            sampler.sample(engine, reqs, params)
            times[name].append(time.perf_counter() - t0)
            counts[name] = sampler.counters()
    base = statistics.median(times["grpo (independent)"])
    lines = ["| sampler | s per call | x grpo | tokens generated | tokens reused |", "|---|---|---|---|---|"]
    for name, ts in times.items():
        c = counts[name]
        lines.append(f"| {name} | {_med(ts, '{:.3f}')} | {base / statistics.median(ts):.2f}x | "
                     f"{c.get('tokens_generated', 0):.0f} | {c.get('tokens_reused', 0):.0f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra override for every run")
    p.add_argument("--strategy", action="append", default=[], metavar="NAME=KEY=VALUE",
                   help="add a strategy, or an override to one (repeatable)")
    p.add_argument("--only", default="", help="comma-separated built-in strategies to run (default: all)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--micro", type=int, default=0, metavar="REPEATS",
                   help="only time the samplers themselves (no training), REPEATS interleaved calls each")
    args = p.parse_args()
    if args.micro:
        print(f"{os.cpu_count()} CPU cores; one torch thread; median (min-max) of {args.micro}")
        print("\n".join(micro(args.micro)))
        return
    chosen = strategies(args)
    results: dict[str, list[dict]] = {k: [] for k in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, overrides in chosen.items():
                results[name].append(run(name, overrides, args, Path(tmp), repeat))
                print(f"# {name} repeat {repeat}: {json.dumps(results[name][-1])}", flush=True)
    print(f"{os.cpu_count()} CPU cores; {args.steps} updates; target held-out greedy accuracy {args.target}; "
          f"overrides {args.set}; median (min-max) of {args.repeats}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
