"""A hand-written GRPO loop in plain torch + transformers: the reference point for reinforge's default recipe.

How fast does a plain loop reach held-out accuracy 0.9 on the same task and model as
``reinforge/recipes/default.yaml`` (GRPO, shipped tiny Llama ``tiny-base``, 2-digit addition)?
It uses none of reinforge's training machinery (learn, rollout, orchestrate, algo); only
``reinforge.models.loading`` (model, tokenizer) and ``reinforge.data.arithmetic`` (the splits), so the
inputs are identical.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_plain_grpo.py [--seed 0] [--steps 1400] \
        [--eval-every 25] [--threads 2] [--out /tmp/plain_grpo.json]

Prints ``step N  elapsed_s X  heldout_acc Y`` per evaluation; writes per-eval (step, elapsed_s, acc), the
median seconds per step of generation and of training, the first elapsed_s with acc >= 0.9 and the final
accuracy to ``--out``.

Choices (each matched to reinforge where it has one):

- Task: ``arithmetic_splits(digits=2, ops="+", heldout_size=500, seed=1234)`` (9,500 train, 500 held out).
  Prompt: ``apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`` then the tokenizer
  without special tokens (``rollout/prompts.py``): ``<bos>12+34=``.
- Prompts per step: 16, drawn from a ``numpy`` generator seeded with ``--seed``: a fresh permutation of the
  train split per epoch, consumed in order (without replacement within an epoch; a batch may straddle two).
- Sampling: 8 completions per prompt, all 128 rows in one batch, left-padded prompts with position ids
  ``cumsum(mask) - 1`` (as reinforge's ``HFDecoder``), the HF KV cache, ``torch.multinomial(softmax(logits))``
  (temperature 1.0, no top-k / top-p), at most 8 new tokens; a row stops at EOS (id 2, the model's and the
  tokenizer's), later steps feed it ``<pad>``; the loop ends when every row has emitted EOS. The completion
  is its tokens up to and including EOS (8 tokens if truncated).
- Reward: reinforge's ``exact_match`` verifier (the ``task.verifier`` default, used by kind ``arithmetic``):
  1.0 iff ``text.strip() == answer.strip()``, ``text`` the completion decoded with ``skip_special_tokens``
  (as ``TorchEngine``: drops EOS and any other special token). Training rewards do not require the
  completion to have ended (reinforge scores truncated ones too; a truncated row can only match by sampling
  six special tokens); held-out correctness does (``eval/heldout.py``: ``finish_reason == "stop"``).
- Advantage (``algo/advantage_estimators.py`` ``grpo``): A = (r - mean_g) / (std_g + 1e-6), std unbiased
  (n - 1), in float64; groups whose 8 rewards are all equal are dropped (``skip_equal_reward_groups``); a
  step with none left makes no update and does not advance the LR schedule (as the reinforge learner).
- Loss: token-level mean over every completion token of the kept rows (EOS included) of -A * log p(token);
  one update per batch, so the PPO ratio is 1 and this is its gradient. No KL, no reference model.
  Training forward: one batched forward over prompt + completion, right-padded with an attention mask,
  ``log_softmax`` in float32; ``model.train()`` (the model has no dropout).
- Optimiser: AdamW lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0; LR factor
  0.5 (1 + cos(pi * k / steps)) after k updates (no warm-up, 0 at the end); grad norm clipped at 1.0.
- Evaluation: greedy (argmax) on the 500 held-out prompts in one batch, 8 new tokens, at step 0, every
  ``--eval-every`` steps and at the end. ``elapsed_s`` of step N is read before step N's evaluation, from a
  clock started after loading (as reinforge's ``time/elapsed_s``: earlier evaluations count, the current
  one does not; reinforge's run also spends time on its pass@k evaluation before training and on
  checkpoints, which this loop does not do).
- Seeds: ``torch.manual_seed(seed)`` (sampling) and the prompt sampler's ``numpy`` generator.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reinforge.data.arithmetic import arithmetic_splits
from reinforge.models.loading import load_model, load_tokenizer

PROMPTS, GROUP, MAX_NEW, TEMPERATURE = 16, 8, 8, 1.0
LR, BETAS, ADAM_EPS, CLIP, ADV_EPS = 1e-4, (0.9, 0.999), 1e-8, 1.0, 1e-6


def encode(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def pad(rows: Sequence[list[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded to one length: token ids and attention mask [B, L]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span], mask[i, span] = torch.tensor(r), 1
    return ids, mask


@torch.no_grad()
def generate(model: Any, prompts: Sequence[list[int]], eos: int, pad_id: int, greedy: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Completions of every prompt (one row each): tokens [B, T] (pad after EOS), lengths (EOS included), ended."""
    ids, mask = pad(prompts, pad_id, left=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache, logits, next_pos = out.past_key_values, out.logits[:, -1], positions[:, -1:] + 1
    batch = ids.shape[0]
    finished = torch.zeros(batch, dtype=torch.bool)
    lengths = torch.full((batch,), MAX_NEW, dtype=torch.long)
    tokens: list[torch.Tensor] = []
    for t in range(MAX_NEW):
        if greedy:
            tok = logits.argmax(-1)
        else:
            tok = torch.multinomial(torch.softmax(logits.float() / TEMPERATURE, -1), 1).squeeze(-1)
        tok = torch.where(finished, pad_id, tok)
        tokens.append(tok)
        done = ~finished & (tok == eos)
        lengths = torch.where(done, t + 1, lengths)
        finished |= done
        if t + 1 == MAX_NEW or bool(finished.all()):
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
    return torch.stack(tokens, dim=1), lengths, finished


def rewards(tokenizer: Any, tokens: torch.Tensor, lengths: torch.Tensor, answers: Sequence[str]) -> torch.Tensor:
    """reinforge's exact_match on each completion's text (special tokens skipped) [B], float64."""
    ids = [row[:n] for row, n in zip(tokens.tolist(), lengths.tolist(), strict=True)]
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return torch.tensor([float(t.strip() == a.strip()) for t, a in zip(texts, answers, strict=True)],
                        dtype=torch.float64)


def grpo_advantages(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row advantage [P * G] and per-row keep mask (the group's rewards are not all equal)."""
    groups = r.view(-1, GROUP)
    adv = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + ADV_EPS)  # unbiased std
    keep = (groups.max(1).values > groups.min(1).values)[:, None].expand_as(groups)
    return adv.reshape(-1), keep.reshape(-1)


def train_step(model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, prompts: Sequence[list[int]],
               tokens: torch.Tensor, lengths: torch.Tensor, adv: torch.Tensor, pad_id: int) -> None:
    """One AdamW update on the token-mean of -A * log p over the rows' completion tokens."""
    rows = [p + tokens[i, : lengths[i]].tolist() for i, p in enumerate(prompts)]
    ids, mask = pad(rows, pad_id, left=False)
    targets = torch.zeros_like(ids, dtype=torch.bool)
    for i, p in enumerate(prompts):
        targets[i, len(p): len(p) + int(lengths[i])] = True
    model.train()
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    weight = targets[:, 1:].float()
    loss = -(adv.float()[:, None] * logp * weight).sum() / weight.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    scheduler.step()
    model.eval()


def evaluate(model: Any, tokenizer: Any, prompts: Sequence[list[int]], answers: Sequence[str]) -> float:
    """Greedy held-out accuracy: exact match and the completion ended with EOS."""
    tokens, lengths, ended = generate(model, prompts, tokenizer.eos_token_id, tokenizer.pad_token_id, greedy=True)
    return float((rewards(tokenizer, tokens, lengths, answers) * ended.double()).mean())


def prompt_stream(n: int, seed: int) -> Iterator[int]:
    """Train-split indices: a fresh seeded permutation per epoch."""
    rng = np.random.default_rng(seed)
    while True:
        yield from rng.permutation(n).tolist()


def cosine(steps: int) -> Any:
    return lambda k: 0.5 * (1.0 + math.cos(math.pi * min(k / max(1, steps), 1.0)))


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer, model = load_tokenizer("tiny-base"), load_model("tiny-base").eval()
    splits = arithmetic_splits(digits=2, ops="+", heldout_size=500, seed=1234)
    train, held = list(splits.train), list(splits.heldout)
    held_prompts, held_answers = [encode(tokenizer, t.prompt) for t in held], [t.answer for t in held]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=ADAM_EPS, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(args.steps))
    stream, eos, pad_id = prompt_stream(len(train), args.seed), tokenizer.eos_token_id, tokenizer.pad_token_id
    evals: list[dict[str, float]] = []
    gen_s: list[float] = []
    train_s: list[float] = []
    t0 = time.perf_counter()

    def record(step: int) -> None:
        elapsed = time.perf_counter() - t0
        acc = evaluate(model, tokenizer, held_prompts, held_answers)
        evals.append({"step": step, "elapsed_s": round(elapsed, 3), "acc": acc})
        print(f"step {step}  elapsed_s {elapsed:.1f}  heldout_acc {acc:.3f}", flush=True)

    record(0)
    for step in range(1, args.steps + 1):
        t_start = time.perf_counter()
        tasks = [train[next(stream)] for _ in range(PROMPTS)]
        prompts = [ids for t in tasks for ids in [encode(tokenizer, t.prompt)] * GROUP]
        tokens, lengths, _ = generate(model, prompts, eos, pad_id, greedy=False)
        r = rewards(tokenizer, tokens, lengths, [t.answer for t in tasks for _ in range(GROUP)])
        adv, keep = grpo_advantages(r)
        t_gen = time.perf_counter()
        if keep.any():
            rows = keep.nonzero().squeeze(-1).tolist()
            train_step(model, optimizer, scheduler, [prompts[i] for i in rows], tokens[rows], lengths[rows],
                       adv[rows], pad_id)
        gen_s.append(t_gen - t_start)
        train_s.append(time.perf_counter() - t_gen)
        if step % args.eval_every == 0 or step == args.steps:
            record(step)
    reached = next((e["elapsed_s"] for e in evals if e["acc"] >= 0.9), None)
    return {"config": vars(args), "evals": evals, "median_generate_s": statistics.median(gen_s),
            "median_train_s": statistics.median(train_s), "first_elapsed_s_acc_0.9": reached,
            "final_acc": evals[-1]["acc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1400)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="/tmp/plain_grpo.json")
    args = parser.parse_args()
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=2))
    reached = result["first_elapsed_s_acc_0.9"]
    print("| seed | time to 0.9 (s) | final | median step (s): generate / train |\n|---|---|---|---|\n"
          f"| {args.seed} | {'not reached' if reached is None else f'{reached:.1f}'} | {result['final_acc']:.3f} | "
          f"{result['median_generate_s']:.4f} / {result['median_train_s']:.4f} |")


if __name__ == "__main__":
    main()
