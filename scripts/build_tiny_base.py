"""Build reinforge's shipped tiny base model from nothing: tokenizer, architecture, pretraining.

    python scripts/build_tiny_base.py [--out reinforge/assets/tiny-base] [--seed 0]

1. A character-level tokenizer (HF `tokenizers` WordLevel over single characters, saved as a
   `PreTrainedTokenizerFast`) with a chat template: ``<bos>`` + message contents, assistant
   turns closed by ``<eos>``.
2. A small Llama-architecture causal LM (tied embeddings, ~2.4M parameters).
3. Plain next-token pretraining on ``<bos>a+b=c<eos>`` strings from the *train* split of the
   built-in arithmetic task (the held-out split is never seen), stopped as soon as held-out
   greedy accuracy reaches ``--target`` so the base is promising but imperfect and RL has room.
4. `save_pretrained` of both, plus a model card with the command, seed, time and accuracies.

Reproducible: fixed seed, deterministic CPU kernels, 2 threads. Nothing is edited by hand afterwards.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.data.arithmetic import arithmetic_splits

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+-= ")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=64,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(vocab_size: int, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return LlamaForCausalLM(config)


def encode_batch(tok: PreTrainedTokenizerFast, texts: list[str]) -> dict[str, torch.Tensor]:
    return tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)


@torch.no_grad()
def heldout_accuracy(model, tok, tasks, samples: int = 1) -> float:
    """Greedy (samples=1) accuracy, or pass@samples at temperature 1 (fraction of prompts with a hit)."""
    model.eval()
    prompts = [tok.apply_chat_template(t.prompt, tokenize=False, add_generation_prompt=True) for t in tasks]
    enc = encode_batch(tok, prompts)
    out = model.generate(
        **enc,
        max_new_tokens=6,
        do_sample=samples > 1,
        temperature=1.0 if samples > 1 else None,
        top_p=None,
        top_k=None,
        num_return_sequences=samples,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=False)
    hits = torch.zeros(len(tasks), dtype=torch.bool)
    for i, text in enumerate(texts):
        answer = tasks[i // samples].answer
        hits[i // samples] |= text.startswith(answer + tok.eos_token)
    model.train()
    return hits.float().mean().item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "reinforge/assets/tiny-base")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, default=0.3, help="stop when held-out greedy accuracy reaches this")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--max-steps", type=int, default=20000)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    start = time.time()

    tok = build_tokenizer()
    model = build_model(len(tok), tok)
    n_params = sum(p.numel() for p in model.parameters())
    splits = arithmetic_splits()  # the built-in task's defaults: 2 digits, '+', 500 held out, seed 1234
    heldout = list(splits.heldout)
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    print(f"tiny-base: {n_params / 1e6:.2f}M parameters, vocab {len(tok)}, train pairs {len(splits.train)}")

    acc, step = 0.0, 0
    for step in range(1, args.max_steps + 1):
        idx = torch.randint(len(splits.train), (args.batch,), generator=gen).tolist()
        texts = [
            tok.apply_chat_template(
                [*splits.train[i].prompt, {"role": "assistant", "content": splits.train[i].answer}], tokenize=False
            )
            for i in idx
        ]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0:
            acc = heldout_accuracy(model, tok, heldout)
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out greedy accuracy {acc:.3f}", flush=True)
            if acc >= args.target:
                break
    else:
        sys.exit(f"did not reach held-out accuracy {args.target} in {args.max_steps} steps (last {acc:.3f})")

    torch.manual_seed(args.seed + 1)
    pass8 = heldout_accuracy(model, tok, heldout, samples=8)
    elapsed = time.time() - start
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    stats = {
        "command": "python scripts/build_tiny_base.py " + " ".join(sys.argv[1:]),
        "seed": args.seed,
        "parameters": n_params,
        "pretraining_steps": step,
        "batch_size": args.batch,
        "learning_rate": args.lr,
        "build_seconds": round(elapsed, 1),
        "heldout_greedy_accuracy": round(acc, 4),
        "heldout_pass_at_8_temperature_1": round(pass8, 4),
        "torch": torch.__version__,
    }
    (args.out / "build_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    (args.out / "README.md").write_text(MODEL_CARD.format(**stats))
    print(json.dumps(stats, indent=2))


MODEL_CARD = """# tiny-base

reinforge's shipped base model, written by `scripts/build_tiny_base.py` (do not edit by hand).

- Architecture: Llama (3 layers, hidden 256, 4 heads, tied embeddings), {parameters} parameters.
- Tokenizer: character level (digits, `+ - =`, space) with `<pad> <bos> <eos> <unk>` and a chat
  template: `<bos>` + message contents, each assistant turn closed by `<eos>`.
- Pretraining: next-token loss on `<bos>a+b=c<eos>` from the train split of the built-in
  arithmetic task (2 digits, `+`); the 500 held-out problems are never seen. Stopped as soon as
  held-out greedy accuracy reached the target, so RL has room to improve.

| | |
|---|---|
| command | `{command}` |
| seed | {seed} |
| pretraining steps (batch {batch_size}, lr {learning_rate}) | {pretraining_steps} |
| build time on 2 CPU cores | {build_seconds} s |
| held-out greedy accuracy | {heldout_greedy_accuracy} |
| held-out pass@8 (temperature 1) | {heldout_pass_at_8_temperature_1} |
| torch | {torch} |
"""

if __name__ == "__main__":
    main()
