"""Rollout engines side by side: reinforge's torch engine, vLLM (in process) and HF ``generate``.

    python benchmarks/bench_engines.py [--workloads demo,30m,135m] [--repeats 3] [--repeats-135m 1]
                                       [--new-tokens N]  # N instead of 64 for 30m/135m (quicker, under load)

Every measurement runs in its own process (one subprocess per engine per repeat), so no engine
inherits another's threads, caches or allocator state; the repeats are interleaved (torch, vllm,
hf, torch, vllm, hf, ... with the order rotated each repeat) so that a change of machine load hits
all three alike. A process builds the model (random weights from seed 0, or the shipped
tiny-base), builds the engine (torch and vllm through the engine registry,
``rollout.engines.ROLLOUT_ENGINES``, so the torch engine measured is whatever the registry holds),
runs one untimed warm-up generate of the same workload, then the timed one.

Workloads (temperature 1, the same prompts for every engine):

- ``demo``: tiny-base (2.4M parameters), 16 arithmetic prompts x 8 samples, at most 8 new tokens,
  stopping at EOS: what a step of the default recipe generates;
- ``30m``: a Llama of ~30M parameters (hidden 512, 8 layers, 8 heads, intermediate 1536, the
  tiny-base vocabulary), 8 prompts x 8 samples, exactly 64 new tokens (EOS ignored);
- ``135m``: SmolLM2-135M-shaped Llama (vocab 49152, hidden 576, intermediate 1536, 9/3 heads GQA,
  30 layers, tied embeddings), 8 prompts x 8 samples, exactly 64 new tokens.

The table gives, per workload and engine, the median time of the timed generate with its range,
tokens/s at the median, and the median load and warm-up (first generate) times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ENGINES = ("torch", "vllm", "hf")
LLAMA = {  # vocab (None: tiny-base's), hidden, layers, heads, kv heads, intermediate
    "30m": (None, 512, 8, 8, 8, 1536),
    "135m": (49152, 576, 30, 9, 3, 1536),
}
WORKLOADS = {  # model, prompts, samples, new tokens, ignore EOS
    "demo": ("tiny", 16, 8, 8, False),
    "30m": ("30m", 8, 8, 64, True),
    "135m": ("135m", 8, 8, 64, True),
}


def build_model(name: str, tokenizer):
    from reinforge.models.loading import load_model

    if name == "tiny":
        return load_model("tiny-base").eval()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden, layers, heads, kv, inter = LLAMA[name]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab or len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                      max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def hf_generate(model, tokenizer, prompts: list[list[int]], samples: int, new_tokens: int, ignore_eos: bool) -> int:
    """HF ``generate`` with a KV cache, ``num_return_sequences`` for the group; returns tokens generated."""
    import torch

    from reinforge.rollout.decoding import left_pad

    ids, attention = left_pad(prompts, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        out = model.generate(ids, attention_mask=attention, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             num_return_sequences=samples, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens if ignore_eos else 0, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    completion = out[:, ids.shape[1]:]
    if ignore_eos:
        return completion.numel()
    done = (completion == tokenizer.eos_token_id).int().cumsum(-1)
    return int(((done == 0) | ((done == 1) & (completion == tokenizer.eos_token_id))).sum())


def child(engine_name: str, workload: str, new_tokens_override: int = 0) -> dict:
    """One measurement in this process: load, warm-up generate, timed generate."""
    import torch

    from reinforge.data.arithmetic import arithmetic_splits
    from reinforge.models.loading import load_tokenizer
    from reinforge.parts import all_kinds
    from reinforge.rollout.engines import engine_spec
    from reinforge.rollout.prompts import encode_prompt
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    model_name, n_prompts, samples, new_tokens, ignore_eos = WORKLOADS[workload]
    if new_tokens_override and ignore_eos:
        new_tokens = new_tokens_override
    t0 = time.perf_counter()
    tokenizer = load_tokenizer("tiny-base")
    model = build_model(model_name, tokenizer)
    tasks = list(arithmetic_splits().heldout)[:n_prompts]
    prompts = [encode_prompt(tokenizer, t.prompt) for t in tasks]
    params = SamplingParams(max_new_tokens=new_tokens, n=samples, ignore_eos=ignore_eos)
    if engine_name == "hf":
        def run() -> int:
            return hf_generate(model, tokenizer, prompts, samples, new_tokens, ignore_eos)
    else:
        all_kinds()
        engine = engine_spec(engine_name).engine_class.from_config(None, model, tokenizer, "cpu", 0, "", copy_policy=False)
        requests = [GenerationRequest(p, t.id) for p, t in zip(prompts, tasks, strict=True)]

        def run() -> int:
            return sum(len(g.token_ids) for g in engine.generate(requests, params))
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = run()
    return {"engine": engine_name, "workload": workload, "load_s": load_s, "warmup_s": warmup_s,
            "gen_s": time.perf_counter() - t0, "tokens": tokens, "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters())}


def measure(engine: str, workload: str, python: str, new_tokens: int = 0) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([python, __file__, "--child", engine, workload, "--new-tokens", str(new_tokens)],
                          capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{engine} on {workload} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def table(results: list[dict]) -> str:
    rows = ["| workload | params | engine | generate s, median [range] | tokens | tok/s | vs torch | load s | "
            "first generate s | runs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for workload in WORKLOADS:
        mine = [r for r in results if r["workload"] == workload]
        if not mine:
            continue
        medians = {e: statistics.median(r["gen_s"] for r in mine if r["engine"] == e)
                   for e in ENGINES if any(r["engine"] == e for r in mine)}
        for engine, median in medians.items():
            runs = [r for r in mine if r["engine"] == engine]
            times = [r["gen_s"] for r in runs]
            tokens = statistics.median(r["tokens"] for r in runs)
            speedup = f"{medians['torch'] / median:.2f}x" if "torch" in medians else "-"
            rows.append(f"| {workload} | {runs[0]['params'] / 1e6:.1f}M | {engine} | {median:.3f} "
                        f"[{min(times):.3f}, {max(times):.3f}] | {tokens:g} | {tokens / median:.0f} | {speedup} | "
                        f"{statistics.median(r['load_s'] for r in runs):.1f} | "
                        f"{statistics.median(r['warmup_s'] for r in runs):.1f} | {len(runs)} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="demo,30m,135m")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--repeats-135m", type=int, default=1, help="the 135M workload is ~30 s a run")
    ap.add_argument("--new-tokens", type=int, default=0, help="new tokens of the 30m/135m workloads (default 64)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the measured processes")
    ap.add_argument("--child", nargs=2, metavar=("ENGINE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.new_tokens)), flush=True)
        return
    engines, workloads = args.engines.split(","), args.workloads.split(",")
    results = []
    for repeat in range(max(args.repeats, args.repeats_135m)):
        for workload in workloads:
            if repeat >= (args.repeats_135m if workload == "135m" else args.repeats):
                continue
            order = engines[repeat % len(engines):] + engines[: repeat % len(engines)]
            for engine in order:
                r = measure(engine, workload, args.python, args.new_tokens)
                results.append(r)
                print(f"repeat {repeat} {workload:5s} {engine:5s} generate {r['gen_s']:.3f} s  {r['tokens']} tokens  "
                      f"load {r['load_s']:.1f} s  first generate {r['warmup_s']:.1f} s", flush=True)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
