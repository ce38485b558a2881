"""Adapter-only sync vs merged weights (``model.lora.sync``, docs/lora.md): bytes per sync, sync time and
generate time on the torch engine (or vLLM, ``--engine vllm``), for the shipped tiny model and a
config-built ~75M Llama.

    python benchmarks/bench_adapter_sync.py [--sizes tiny,75m] [--repeats 5] [--threads 2] [--engine torch]

Per size and LoRA setting: the bytes an engine receives per sync (merged: every parameter of the
model, ``learn.lora.merged_weights``; adapter: A and B of every adapted layer, ``adapter_weights``), and,
timed in interleaved repeats (the modes alternate within a repeat, their order flipped every repeat):

- ``sync``: ``engine.update_weights(peft_model, version)`` as the training loop calls it (merged:
  W + (alpha/r) B A per adapted layer, copied into the engine's model, the lean forward's fused and
  packed copies rebuilt; adapter: A and B copied, the per-projection stacks rebuilt; on vLLM, merged:
  ``reload_weights`` of every parameter, adapter: A and B written as a peft directory in memory-backed
  temporary storage and registered as a new LoRA request, loaded by the next generate);
- ``generate``: one rollout batch sampled after that sync (merged weights; the unmerged adapter; the
  same batch with its rows spread over 4 adapters).

Settings: ``tiny`` is tiny-base (2.4M) on 16 arithmetic prompts x 8 samples, <= 8 new tokens (a
default training step's rollout); ``75m`` is a Llama of vocab 32000, hidden 768, intermediate 2048, 8
layers, 12 query / 4 key-value heads (random init, no download), 4 prompts x 4 samples, exactly 16 new
tokens. LoRA r=16, alpha=32 on all seven projections and r=8, alpha=16 on q, v; fp32, temperature 1.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time

import torch

LLAMA_75M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                 num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LORAS = {"r16-all": (16, 32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
         "r8-qv": (8, 16, ["q_proj", "v_proj"])}
SETTINGS = {"tiny": (16, 8, 8, False), "75m": (4, 4, 16, True)}  # prompts, samples, new tokens, ignore_eos


def build(size: str):  # type: ignore[no-untyped-def]
    from reinforge.data.arithmetic import arithmetic_splits
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.prompts import encode_prompt
    from reinforge.rollout.types import GenerationRequest, SamplingParams

    tok = load_tokenizer("tiny-base")
    if size == "tiny":
        model = load_model("tiny-base").eval()
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**LLAMA_75M)).eval()
    prompts, samples, new, ignore_eos = SETTINGS[size]
    reqs = [GenerationRequest(encode_prompt(tok, t.prompt), t.id) for t in list(arithmetic_splits().heldout)[:prompts]]
    return model, tok, reqs, SamplingParams(max_new_tokens=new, n=samples, ignore_eos=ignore_eos)


def policy_of(model, lora: str, seed: int = 1):  # type: ignore[no-untyped-def]
    """A LoRA policy over a copy of ``model`` with B random (a trained adapter's shape and scale)."""
    from reinforge.config import LoraConfig
    from reinforge.learn.lora import wrap_lora

    r, alpha, targets = LORAS[lora]
    policy = wrap_lora(copy.deepcopy(model), LoraConfig(enabled=True, r=r, alpha=alpha, target_modules=targets))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.01, generator=torch.Generator().manual_seed(seed))
    return policy


def engines(model, tok, sync: str, engine: str, rank: int):  # type: ignore[no-untyped-def]
    from reinforge.config import load_config
    from reinforge.orchestrate.components import build_engine

    cfg = load_config(None, ["model.lora.enabled=true", f"model.lora.sync={sync}", f"model.lora.r={rank}",
                             f"rollout.engine={engine}"])
    return build_engine(cfg, model, tok)


class MergedView:
    """vLLM allows one engine per process (a second one's start-up breaks the first's parallel state): with
    ``--engine vllm`` the merged sync runs on the adapter engine itself, through vLLM's ``reload_weights``
    of the merged weights, and its batch runs without an adapter (the base's kernels, LoRA enabled)."""

    def __init__(self, engine) -> None:  # type: ignore[no-untyped-def]
        self.engine = engine

    def update_weights(self, policy, version: int) -> None:  # type: ignore[no-untyped-def]
        from reinforge.learn.lora import merged_weights
        from reinforge.rollout.vllm_engine import VLLMRolloutEngine

        VLLMRolloutEngine.update_weights(self.engine, merged_weights(policy), version)

    def generate(self, requests, params, generator=None):  # type: ignore[no-untyped-def]
        default, self.engine.default_adapter = self.engine.default_adapter, None
        try:
            return self.engine.generate(requests, params, generator=generator)
        finally:
            self.engine.default_adapter = default


def bench_size(size: str, repeats: int, engine_name: str = "torch") -> list[dict]:
    from reinforge.learn.lora import adapter_weights, merged_weights
    from reinforge.rollout.types import GenerationRequest

    model, tok, reqs, params = build(size)
    n_params = sum(p.numel() for p in model.parameters())
    rows = []
    for lora in LORAS:
        policy = policy_of(model, lora)
        full = sum(t.numel() * t.element_size() for t in merged_weights(policy).values())
        sent = adapter_weights(policy).nbytes()
        rank = LORAS[lora][0]
        adapter = engines(model, tok, "adapter", engine_name, rank)
        merged = engines(model, tok, "merged", engine_name, rank) if engine_name == "torch" else MergedView(adapter)
        for i, name in enumerate(("a1", "a2", "a3")):  # three more adapters for the mixed batch
            adapter.update_adapter(name, adapter_weights(policy_of(model, lora, seed=2 + i)))
        mixed = [GenerationRequest(r.prompt_ids, r.request_id, adapter=("default", "a1", "a2", "a3")[i % 4])
                 for i, r in enumerate(reqs)]
        times: dict[str, list[float]] = {k: [] for k in ("sync merged", "sync adapter", "gen merged", "gen adapter",
                                                          "gen 4 adapters")}
        runs = [("merged", merged, reqs), ("adapter", adapter, reqs), ("4 adapters", adapter, mixed)]
        for engine, _ in ((merged, 0), (adapter, 0)):  # warm-up
            engine.update_weights(policy, 0)
            engine.generate(reqs, params, generator=torch.Generator().manual_seed(0))
        for rep in range(repeats):
            for mode, engine, batch in (runs if rep % 2 == 0 else runs[::-1]):
                if mode != "4 adapters":
                    t = time.perf_counter()
                    engine.update_weights(policy, rep + 1)
                    times[f"sync {mode}"].append(time.perf_counter() - t)
                t = time.perf_counter()
                engine.generate(batch, params, generator=torch.Generator().manual_seed(rep))
                times[f"gen {mode}"].append(time.perf_counter() - t)
        rows.append({"size": f"{size} ({engine_name})", "params": n_params, "lora": lora, "merged_bytes": full, "adapter_bytes": sent,
                     **{k: (statistics.median(v), min(v), max(v)) for k, v in times.items()}})
        del merged, adapter, runs, engine  # vLLM: the old engine must be gone before the next starts (one at a time)
        gc.collect()
    return rows


def report(rows: list[dict], repeats: int) -> None:
    print(f"\n| model | params | LoRA | merged MB/sync | adapter MB/sync | ratio | sync merged s | sync adapter s "
          f"| generate merged s | generate adapter s | generate, rows over 4 adapters s |  (median [min, max] of {repeats})")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        def cell(k: str, r: dict = r) -> str:
            return f"{r[k][0]:.4f} [{r[k][1]:.4f}, {r[k][2]:.4f}]"
        print(f"| {r['size']} | {r['params'] / 1e6:.1f}M | {r['lora']} | {r['merged_bytes'] / 2**20:.2f} | "
              f"{r['adapter_bytes'] / 2**20:.3f} | {r['merged_bytes'] / r['adapter_bytes']:.0f}x | "
              f"{cell('sync merged')} | {cell('sync adapter')} | {cell('gen merged')} | {cell('gen adapter')} | "
              f"{cell('gen 4 adapters')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="tiny,75m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="torch", choices=["torch", "vllm"], help="the rollout engine that receives the syncs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [row for size in args.sizes.split(",") for row in bench_size(size, args.repeats, args.engine)]
    report(rows, args.repeats)


if __name__ == "__main__":
    main()
