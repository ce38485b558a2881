"""Rollout throughput: reinforge's TorchRolloutEngine vs HF `generate`, side by side in one run.

    python benchmarks/bench_rollout.py [--sizes tiny,4m,30m] [--repeats 5] [--rl-setting]

Two settings:

- ``--rl-setting``: the shipped tiny-base model on its own task, 16 prompts x 8 samples,
  max_new_tokens 8, stopping at EOS (what a training step generates).
- default: fixed-length generation (EOS ignored, so both sides generate exactly the same number
  of tokens) for three model sizes, the shipped tiny-base (2.4M parameters), a ~4M and a ~30M
  Llama config (random weights, built here), 8 prompts x 8 samples = 64 sequences.

Both sides sample at temperature 1 with a KV cache; HF gets ``num_return_sequences`` for the
group. Repeats are interleaved (HF, ours, HF, ours, ...); the table gives medians and the ratio.
For the largest model, the achieved FLOP/s of our decode is compared with a measured fp32 matmul
peak (2 * params * tokens for the matmuls plus the attention over the cache).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from reinforge.data.arithmetic import arithmetic_splits
from reinforge.models.loading import load_model, load_tokenizer
from reinforge.rollout.prompts import encode_prompt
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import GenerationRequest, SamplingParams

CONFIGS = {  # hidden, layers, heads, kv heads, intermediate
    "4m": (256, 4, 4, 4, 768),
    "30m": (512, 8, 8, 8, 1536),
}


def build_model(size: str, vocab: int) -> torch.nn.Module:
    if size == "tiny":
        return load_model("tiny-base").eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, kv, inter = CONFIGS[size]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def matmul_peak_gflops(n: int = 1024, repeats: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9


def interleaved(fns: dict[str, callable], repeats: int) -> dict[str, tuple[float, float, float, int]]:
    """name -> (median s, min s, max s, tokens) over ``repeats`` interleaved runs (after one warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    tokens: dict[str, int] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), max(v), tokens[k]) for k, v in times.items()}


def bench(size: str, prompts: int, group: int, new_tokens: int, ignore_eos: bool, repeats: int,
          compile_decode: bool = False) -> tuple[dict, torch.nn.Module, int]:
    tok = load_tokenizer("tiny-base")
    model = build_model(size, len(tok))
    tasks = list(arithmetic_splits().heldout)[:prompts]
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in tasks]
    params = SamplingParams(max_new_tokens=new_tokens, n=group, ignore_eos=ignore_eos)
    engines = {
        "reinforge (lean, continuous)": TorchRolloutEngine(model, tok, seed=0),
        "reinforge (lean, static)": TorchRolloutEngine(model, tok, seed=0, continuous=False),
        "reinforge (HF forward, static)": TorchRolloutEngine(model, tok, seed=0, use_lean_forward=False),
    }
    if compile_decode:
        compiled = TorchRolloutEngine(model, tok, seed=0)
        compiled.lean.decode_slots = torch.compile(compiled.lean.decode_slots, dynamic=True)
        engines["reinforge (lean, continuous, torch.compile)"] = compiled
    texts = [tok.apply_chat_template(t.prompt, tokenize=False, add_generation_prompt=True) for t in tasks]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    prompt_len = enc["input_ids"].shape[1]
    eos = tok.eos_token_id

    def hf() -> int:
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens if ignore_eos else 0,
                                 num_return_sequences=group, pad_token_id=tok.pad_token_id, eos_token_id=eos)
        gen = out[:, prompt_len:]
        if ignore_eos:
            return gen.numel()
        ends = (gen == eos).int()
        first = torch.where(ends.any(-1), ends.argmax(-1) + 1, torch.full_like(ends[:, 0], gen.shape[1]))
        return int(first.sum())

    fns = {"HF generate": hf}
    for name, engine in engines.items():
        fns[name] = lambda e=engine: sum(len(g.token_ids) for g in e.generate(reqs, params))
    return interleaved(fns, repeats), model, prompt_len


def time_update_weights(model: torch.nn.Module, repeats: int = 7) -> float:
    """Median seconds of ``engine.update_weights`` (in-place copy + re-fusing the lean weights)."""
    from reinforge.models.loading import load_tokenizer

    engine = TorchRolloutEngine(copy.deepcopy(model), load_tokenizer("tiny-base"))
    times = []
    for v in range(repeats):
        t0 = time.perf_counter()
        engine.update_weights(model, v)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def report(title: str, results: dict) -> None:
    base = results["HF generate"][0]
    print(f"\n{title}\n")
    print("| engine | median s (min-max) | generated tok/s | speed vs HF generate |")
    print("|---|---|---|---|")
    for name, (med, lo, hi, tokens) in results.items():
        print(f"| {name} | {med:.4f} ({lo:.4f}-{hi:.4f}) | {tokens / med:,.0f} | {base / med:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,4m,30m")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rl-setting", action="store_true", help="tiny-base, 16 x 8, 8 new tokens, stop at EOS")
    p.add_argument("--compile", action="store_true", help="also time the lean decode under torch.compile")
    args = p.parse_args()
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.rl_setting:
        results, _, _ = bench("tiny", 16, 8, 8, False, args.repeats, args.compile)
        report("RL setting: tiny-base, 16 prompts x 8 samples, max_new_tokens 8, stop at EOS", results)
        return
    for size in args.sizes.split(","):
        results, model, prompt_len = bench(size, args.prompts, args.group, args.max_new_tokens, True,
                                           args.repeats, args.compile)
        n_params = sum(p.numel() for p in model.parameters())
        upd = time_update_weights(model)
        report(f"{size}: {n_params / 1e6:.1f}M parameters, {args.prompts} prompts x {args.group} samples, "
               f"prompt {prompt_len} tokens, exactly {args.max_new_tokens} new tokens", results)
        print(f"\nupdate_weights (in place, re-fusing the lean weights): {upd * 1e3:.2f} ms median")
        if size == "30m":
            cfg = model.config
            matmul_params = n_params - cfg.vocab_size * cfg.hidden_size  # embedding lookup is not a matmul
            seqs, new = args.prompts * args.group, args.max_new_tokens
            avg_ctx = prompt_len + new / 2
            attn = 4 * cfg.num_hidden_layers * cfg.hidden_size * avg_ctx  # QK^T and AV per token
            flops = seqs * new * (2 * matmul_params + attn)
            med = results["reinforge (lean, continuous)"][0]
            peak = matmul_peak_gflops()
            print(f"\nachieved {flops / med / 1e9:.1f} GFLOP/s in reinforge's decode (incl. prefill time) vs a "
                  f"measured fp32 matmul peak of {peak:.1f} GFLOP/s (1024x1024): {flops / med / 1e9 / peak:.0%}")


if __name__ == "__main__":
    main()
