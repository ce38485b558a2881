"""Learner update time: shared-prefix training forward vs the HF forward, and fused vs foreach AdamW,
side by side in one run (interleaved repeats).

    python benchmarks/bench_learner.py [--prompts 16] [--group 8] [--repeats 7]

One rollout batch from the shipped tiny-base model on the arithmetic task (16 prompts x 8 by default, the
demo's shape until 2026-11-29; ``--prompts 32`` is its shape since), then ``Learner.update`` (forward,
backward, AdamW step) timed on copies of the same model with ``train.shared_prefix`` on and off, in the
recipe's ``train.autocast`` (bf16 where the CPU has bf16 instructions) and, for the fused row, also in
float32. The forwards compute the same gradient (tests/test_shared_prefix.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.orchestrate.components import build_components
from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(None, [f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}"])
    c = build_components(cfg)
    tasks = c.sampler.next_batch(args.prompts)
    _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=0)
    trajs = score_single_turn(tasks, gens, args.group, c.reward_pool)
    batch, stats = build_batch(trajs, cfg.algo.model_copy(update={"skip_equal_reward_groups": False}), c.engine.pad_id)
    assert batch is not None
    tokens = int(batch.attention_mask.sum())
    variants = {  # name -> train overrides; interleaved repeats, median per variant
        "HF forward, AdamW foreach": {"shared_prefix": False},
        "shared-prefix forward, AdamW foreach": {"shared_prefix": True},
        "shared-prefix forward, AdamW fused": {"shared_prefix": True, "fused_optimizer": True},
        "shared-prefix forward, AdamW fused, float32": {"shared_prefix": True, "fused_optimizer": True,
                                                        "autocast": "none"},
    }
    learners = {}
    for name, update in variants.items():
        run_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update=update)})
        learners[name] = Learner.for_run(copy.deepcopy(c.learner.model), run_cfg)
        learners[name].update(batch)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, learner in learners.items():
            t0 = time.perf_counter()
            learner.update(batch)
            times[name].append(time.perf_counter() - t0)
    rows = [(name, statistics.median(t), min(t), max(t)) for name, t in times.items()]
    print(f"{len(batch)} sequences ({args.prompts} prompts x {args.group}), {tokens} tokens, torch {torch.__version__}")
    print("| learner | median s per update (min-max) | speed-up |\n|---|---|---|")
    for name, t, lo, hi in rows:
        print(f"| {name} | {t:.4f} ({lo:.4f}-{hi:.4f}) | {rows[0][1] / t:.2f}x |")


if __name__ == "__main__":
    main()
