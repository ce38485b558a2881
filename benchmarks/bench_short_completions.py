"""The learner on short completions on the CPU: attention kernels in bf16, and updates by completion width.

    python benchmarks/bench_short_completions.py [--repeats 7] [--batches 60] [--baseline OLD_shared_prefix.py]

Part 1, attention: ``F.scaled_dot_product_attention`` forward and backward in bf16 through torch's flash
kernel and through its math kernel, at the shapes of the shared-prefix forward (96 completions x 4 heads,
queries = the completion width, keys = prompt + completion) and longer ones, interleaved repeats, median.
This is the measurement behind ``MATH_ATTENTION_MAX_QUERIES`` in ``reinforge/learn/shared_prefix.py``.

Part 2, the learner: ``--batches`` rollout batches of the default recipe (the shipped tiny base, 16 prompts x
8), then ``Learner.update`` on each, interleaved across the arms: the shared-prefix forward as it is with
torch's default (for-loop) AdamW and with the fused AdamW, and, with ``--baseline``, a ``SharedPrefixForward``
loaded from another version of ``shared_prefix.py`` (``git show REV:reinforge/learn/shared_prefix.py > old.py``). Per arm the median and mean
update, and the median per completion width (the longest completion of the batch, in tokens).
"""

from __future__ import annotations

import argparse
import collections
import copy
import importlib.util
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from reinforge.config import load_config
from reinforge.learn.learner import Learner
from reinforge.orchestrate.components import build_components
from reinforge.orchestrate.episodes import build_batch, generate_single_turn, score_single_turn

SHAPES = [(96, 4, 11), (96, 5, 12), (96, 6, 13), (96, 8, 15), (96, 16, 24), (32, 64, 96), (8, 128, 256),
          (8, 192, 256), (4, 256, 512)]  # (rows, queries, keys); 4 heads of 64


def attention_ms(rows: int, queries: int, keys: int, kernel: SDPBackend, repeats: int) -> float:
    """Median ms of one bf16 attention forward + backward with a causal-to-the-end mask through ``kernel``."""
    q, k, v = (torch.randn(rows, 4, n, 64, dtype=torch.bfloat16, requires_grad=True) for n in (queries, keys, keys))
    mask = torch.ones(rows, 1, queries, keys, dtype=torch.bool).tril(keys - queries)
    times = []
    for _ in range(repeats + 2):
        t0 = time.perf_counter()
        with sdpa_kernel(kernel):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.sum().backward()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[2:])


def attention_table(repeats: int) -> None:
    print("| rows x queries x keys | flash (ms) | math (ms) | flash / math |\n|---|---|---|---|")
    for rows, queries, keys in SHAPES:
        flash = attention_ms(rows, queries, keys, SDPBackend.FLASH_ATTENTION, repeats)
        math = attention_ms(rows, queries, keys, SDPBackend.MATH, repeats)
        print(f"| {rows} x {queries} x {keys} | {flash:.2f} | {math:.2f} | {flash / math:.2f} |")


def rollout_batches(cfg, n: int) -> tuple[list, torch.nn.Module]:
    """``n`` rollout batches of the run ``cfg`` from its initial policy, and that policy."""
    c = build_components(cfg)
    batches = []
    for i in range(n):
        tasks = c.sampler.next_batch(cfg.rollout.prompts_per_step)
        _, gens = generate_single_turn(tasks, c.engine, c.make_env, c.sampling_params(), seed=i)
        batch, _ = build_batch(score_single_turn(tasks, gens, cfg.rollout.group_size, c.reward_pool), cfg.algo,
                               c.engine.pad_id)
        if batch is not None:
            batches.append(batch)
    return batches, c.learner.model


def learners(cfg, model, baseline: str | None) -> dict[str, Learner]:
    """The arms: a learner per setting, each on its own copy of ``model``."""
    plain, fused = (cfg.model_copy(update={"train": cfg.train.model_copy(update={"fused_optimizer": f})})
                    for f in (False, True))
    arms = {"shared-prefix forward, AdamW": Learner.for_run(copy.deepcopy(model), plain),
            "the same, fused AdamW": Learner.for_run(copy.deepcopy(model), fused)}
    if baseline:
        spec = importlib.util.spec_from_file_location("baseline_shared_prefix", baseline)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        old = Learner.for_run(copy.deepcopy(model), plain)
        old.forward.shared = module.SharedPrefixForward(old.forward.shared.model)
        arms = {f"baseline ({baseline}), AdamW": old, **arms}
    return arms


def learner_table(batches: list, arms: dict[str, Learner]) -> None:
    widths = [int((b.attention_mask.sum(-1) - b.prefix_len).max()) for b in batches]
    times: dict[str, list[float]] = {name: [] for name in arms}
    for learner in arms.values():
        learner.update(batches[0])  # warm-up
    for batch in batches:
        for name, learner in arms.items():
            t0 = time.perf_counter()
            learner.update(batch)
            times[name].append(time.perf_counter() - t0)
    print(f"\n{len(batches)} batches, completion widths {sorted(collections.Counter(widths).items())}")
    by_width = sorted(set(widths))
    print("| arm | median update (s) | mean | " + " | ".join(f"width {w}" for w in by_width) + " |")
    print("|---|---|---|" + "---|" * len(by_width))
    for name, ts in times.items():
        per = [statistics.median([t for t, w in zip(ts, widths, strict=True) if w == width]) for width in by_width]
        print(f"| {name} | {statistics.median(ts):.4f} | {statistics.mean(ts):.4f} | "
              + " | ".join(f"{t:.4f}" for t in per) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--baseline", default=None, help="another version of reinforge/learn/shared_prefix.py")
    args = p.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    attention_table(args.repeats)
    cfg = load_config(None, [])
    batches, model = rollout_batches(cfg, args.batches)
    learner_table(batches, learners(cfg, model, args.baseline))


if __name__ == "__main__":
    main()
