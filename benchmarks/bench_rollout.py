"""Rollout throughput: reinforge's TorchRolloutEngine vs HF `generate`, side by side in one run.

    python benchmarks/bench_rollout.py [--prompts 16] [--group 8] [--repeats 5]

Same model (the shipped tiny-base), same prompts, same number of sampled sequences and the same
max_new_tokens; both sample at temperature 1 with a KV cache. Reports the median wall time of
``--repeats`` runs and generated tokens per second; the ratio is what matters (absolute times
depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from reinforge.data.arithmetic import arithmetic_splits
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams
from reinforge.train.model import load_model, load_tokenizer


def median_time(fn, repeats: int) -> tuple[float, int]:
    fn()  # warm-up
    times, tokens = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(2)
    tok = load_tokenizer("tiny-base")
    model = load_model("tiny-base").eval()
    tasks = list(arithmetic_splits().heldout)[: args.prompts]
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in tasks]
    lean = TorchRolloutEngine(load_model("tiny-base"), tok, seed=0)
    hf_fwd = TorchRolloutEngine(load_model("tiny-base"), tok, seed=0, use_lean_forward=False)
    assert lean.lean is not None and hf_fwd.lean is None
    params = SamplingParams(max_new_tokens=args.max_new_tokens, n=args.group)

    def ours() -> int:
        return sum(len(g.token_ids) for g in lean.generate(reqs, params))

    def ours_hf_forward() -> int:
        return sum(len(g.token_ids) for g in hf_fwd.generate(reqs, params))

    texts = [tok.apply_chat_template(t.prompt, tokenize=False, add_generation_prompt=True) for t in tasks]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    @torch.no_grad()
    def hf() -> int:
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_p=None, top_k=None, max_new_tokens=args.max_new_tokens,
            num_return_sequences=args.group, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )
        new = out[:, enc["input_ids"].shape[1] :]
        ended = (new == tok.eos_token_id).int().cumsum(-1)
        return int(((ended == 0) | ((ended == 1) & (new == tok.eos_token_id))).sum())

    rows = [
        ("HF generate", *median_time(hf, args.repeats)),
        ("TorchRolloutEngine, HF forward", *median_time(ours_hf_forward, args.repeats)),
        ("TorchRolloutEngine, lean forward", *median_time(ours, args.repeats)),
    ]
    base = rows[0][1]
    print(f"{args.prompts} prompts x {args.group} samples, max_new_tokens={args.max_new_tokens}, torch {torch.__version__}")
    print("| engine | median s | generated tok/s | speed vs HF generate |\n|---|---|---|---|")
    for name, t, n in rows:
        print(f"| {name} | {t:.4f} | {n / t:,.0f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
