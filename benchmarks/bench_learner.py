"""Learner update time: shared-prefix training forward vs the HF forward, side by side in one run.

    python benchmarks/bench_learner.py [--prompts 16] [--group 8] [--repeats 7]

One rollout batch from the shipped tiny-base model on the arithmetic task (the default demo's
shape), then ``Learner.update`` (forward, backward, AdamW step) timed on copies of the same
model with ``train.shared_prefix`` on and off. Both compute the same gradient (tests/test_shared_prefix.py).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from reinforge.config import load_config
from reinforge.orchestrate.components import build_components
from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn
from reinforge.train.learner import Learner


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
    envs, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=0)
    trajs = score_single_turn(tasks, envs, gens, args.group)
    batch, stats = build_batch(trajs, cfg.algo.model_copy(update={"skip_equal_reward_groups": False}), c.engine.pad_id)
    assert batch is not None
    tokens = int(batch.attention_mask.sum())
    rows = []
    for shared in (False, True):
        run_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"shared_prefix": shared})})
        learner = Learner(copy.deepcopy(c.learner.model), run_cfg)
        assert (learner.shared_prefix is not None) == shared
        learner.update(batch)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            learner.update(batch)
            times.append(time.perf_counter() - t0)
        rows.append(("shared-prefix forward" if shared else "HF forward", statistics.median(times)))
    print(f"{len(batch)} sequences ({args.prompts} prompts x {args.group}), {tokens} tokens, torch {torch.__version__}")
    print("| learner forward | median s per update | speed-up |\n|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t:.4f} | {rows[0][1] / t:.2f}x |")


if __name__ == "__main__":
    main()
