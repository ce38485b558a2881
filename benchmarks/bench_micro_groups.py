"""Infinite Sampling's micro sampling groups against whole-group sampling: peak KV-cache slots and bytes,
decode steps and tokens/s, side by side in one run.

    python benchmarks/bench_micro_groups.py [--size tiny|30m] [--prompts 16] [--group 16] [--new 16]
                                            [--micro 4] [--slots 64] [--repeats 5] [--ignore-eos]

The torch engine (lean forward, continuous batching) samples ``--prompts`` prompts of the built-in task x
``--group`` samples: ``independent`` (every group admitted whole: prompts x group slots, the engine's
limit 512 permitting), ``micro_groups`` with micro-groups of ``--micro`` under ``--slots`` slots, queued
shortest-predicted-first (``sjf``; its length memory warmed by one call) and in request order
(``fifo``). Peak KV cache: the slot cache the engine allocates (its K and V tensors' bytes). Repeats are
interleaved (independent, sjf, fifo, ...); medians (min-max); ratios are against ``independent``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from reinforge.data.arithmetic import arithmetic_splits
from reinforge.models.loading import load_model, load_tokenizer
from reinforge.rollout.group_samplers import build_group_sampler
from reinforge.rollout.micro_groups import MicroGroupSettings
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams


def build_model(size: str, vocab: int) -> torch.nn.Module:
    if size == "tiny":
        return load_model("tiny-base").eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, intermediate_size=1536, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


class Meter:
    """Records the engine's slot caches (slots, K+V bytes) and decode steps."""

    def __init__(self, engine: TorchRolloutEngine) -> None:
        self.slots, self.bytes, self.steps = 0, 0, 0
        new_cache, decode = engine.lean.new_slot_cache, engine.lean.decode_slots

        def recording_cache(slots: int, max_len: int):  # type: ignore[no-untyped-def]
            cache = new_cache(slots, max_len)
            self.slots, self.bytes = max(self.slots, slots), max(self.bytes, cache.k.nbytes + cache.v.nbytes)
            return cache

        def counting_decode(*a, **k):  # type: ignore[no-untyped-def]
            self.steps += 1
            return decode(*a, **k)

        engine.lean.new_slot_cache, engine.lean.decode_slots = recording_cache, counting_decode


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ignore-eos", action="store_true")
    args = ap.parse_args()
    tok = load_tokenizer("tiny-base")
    model = build_model(args.size, len(tok))
    tasks = list(arithmetic_splits().heldout)[: args.prompts]
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in tasks]
    params = SamplingParams(max_new_tokens=args.new, n=args.group, ignore_eos=args.ignore_eos)
    samplers = {"independent": build_group_sampler("independent")}
    for order in ("sjf", "fifo"):
        samplers[f"micro_groups {order}"] = build_group_sampler(
            "micro_groups", MicroGroupSettings(micro_group=args.micro, max_slots=args.slots, order=order))
    engines = {name: TorchRolloutEngine(model, tok, seed=0) for name in samplers}
    meters = {name: Meter(e) for name, e in engines.items()}
    for name, s in samplers.items():  # warm-up (and the sjf length memory)
        s.sample(engines[name], reqs, params)
    times: dict[str, list[float]] = {k: [] for k in samplers}
    tokens: dict[str, list[int]] = {k: [] for k in samplers}
    steps: dict[str, list[int]] = {k: [] for k in samplers}
    for _ in range(args.repeats):
        for name, s in samplers.items():
            meters[name].steps = 0
            t0 = time.perf_counter()
            out = s.sample(engines[name], reqs, params)
            times[name].append(time.perf_counter() - t0)
            tokens[name].append(sum(len(g.token_ids) for g in out))
            steps[name].append(meters[name].steps)
    base = statistics.median(t / s for t, s in zip(tokens["independent"], times["independent"], strict=True))
    print(f"{args.size}: {args.prompts} prompts x {args.group} samples, max_new_tokens {args.new}, "
          f"micro-groups of {args.micro} under {args.slots} slots, {args.repeats} interleaved repeats")
    print("| sampler | peak KV slots | peak KV cache | decode steps | tokens/s median (min-max) | tokens/s ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in samplers:
        rates = [t / s for t, s in zip(tokens[name], times[name], strict=True)]
        m = meters[name]
        print(f"| {name} | {m.slots} | {m.bytes / 2**20:.2f} MiB | {statistics.median(steps[name]):.0f} | "
              f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f}) | "
              f"{statistics.median(rates) / base:.2f} |")


if __name__ == "__main__":
    main()
