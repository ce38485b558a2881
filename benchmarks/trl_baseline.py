"""The shared set-up of benchmarks/bench_vs_trl.py: model, tokenizer and task, built from nothing.

Both frameworks load the same weights and tokenizer from one directory (no hub downloads):

- a 48-token character tokenizer (``<pad> <bos> <eos> <unk>``, digits, ``a-z``, ``+-*/=()`` and
  space; a post-processor puts ``<bos>`` in front of every encoded text, so raw prompts get a BOS
  in both frameworks);
- a Qwen2 causal LM with tied embeddings, random init with a fixed seed: ``0.5M`` = hidden 128,
  2 layers, 4 heads, intermediate 512 (531,840 parameters); ``4.2M`` = hidden 256, 4 layers,
  4 heads, intermediate 1024 (4,211,968 parameters);
- optionally (``pretrain_steps > 0``) a short next-token pretraining on ``a+b=c<eos>`` so the RL
  reward is not stuck at 0 (a random model almost never writes a correct sum);
- the task: raw prompts ``a+b=`` with a, b in [0, 19], answer ``str(a + b)``; reward 1 when the
  completion (up to EOS, whitespace-stripped) equals the answer, else 0. 8 of the 400 problems
  are held out (reinforge needs a held-out split; neither framework trains on them).

Only this module's functions import torch/transformers, so a child process that imports it
still measures the import time of its framework alone.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789") + list("abcdefghijklmnopqrstuvwxyz") + list("+-*/=() ")
assert len(SPECIALS) + len(CHARS) == 48

VARIANTS = {
    "0.5M": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512},
    "4.2M": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
}
HELDOUT = 8
MAX_OPERAND = 19


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        padding_side="left", model_max_length=64,
    )


def build_model(variant: str, tok, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tok), max_position_embeddings=64, tie_word_embeddings=True, rms_norm_eps=1e-6,
        num_key_value_heads=VARIANTS[variant]["num_attention_heads"], use_sliding_window=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        **VARIANTS[variant],
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    return model


def problems() -> tuple[list[dict], list[dict]]:
    """(train, held-out) rows ``{"prompt": "a+b=", "answer": "c"}``; a fixed seeded split."""
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)}
            for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    order = list(range(len(rows)))
    random.Random(1234).shuffle(order)
    held = set(order[:HELDOUT])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def pretrain(model, tok, rows: list[dict], steps: int, seed: int, lr: float = 1e-3, batch: int = 64) -> float:
    """Next-token loss on ``<bos>a+b=c<eos>`` (train rows only); returns greedy train accuracy after."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        idx = torch.randint(len(rows), (batch,), generator=gen).tolist()
        texts = [rows[i]["prompt"] + rows[i]["answer"] + tok.eos_token for i in idx]
        enc = tok(texts, return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        enc = tok([r["prompt"] for r in rows], return_tensors="pt", padding=True)
        out = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=False)
    hits = [t.startswith(r["answer"] + tok.eos_token) for t, r in zip(texts, rows, strict=True)]
    return sum(hits) / len(hits)


def build_workdir(workdir: Path, variant: str, seed: int = 0, pretrain_steps: int = 0) -> dict:
    """Model, tokenizer and task files in ``workdir``; returns a description of what was built."""
    import torch

    torch.set_num_threads(2)
    tok = build_tokenizer()
    model = build_model(variant, tok, seed)
    train_rows, heldout_rows = problems()
    acc = pretrain(model, tok, train_rows, pretrain_steps, seed) if pretrain_steps else None
    model_dir = workdir / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    for name, rows in (("train.jsonl", train_rows), ("heldout.jsonl", heldout_rows)):
        (workdir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "variant": variant, "parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
        "train_problems": len(train_rows), "heldout_problems": len(heldout_rows), "seed": seed,
        "pretrain_steps": pretrain_steps, "pretrain_train_greedy_acc": acc,
    }


def reward_exact(completion: str, answer: str) -> float:
    """The reward of both frameworks (same rule as reinforge's ``exact_match`` verifier)."""
    return float(completion.strip() == answer.strip())
