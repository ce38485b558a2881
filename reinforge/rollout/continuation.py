"""What group samplers need beyond ``engine.generate``, built on the engine's public API only.

* ``sampling_distribution``: the distribution a token is drawn from, softmax(restrict(z / T)) with
  top-k / top-p (the same ``restrict_logits`` as the engine), and the reported log-probs
  log softmax(z / T) (untruncated, what the learner recomputes).
* ``generate_recording``: ``engine.generate`` that also records, through its ``on_step`` hook, every
  sampled token's sampling distribution (sparse: ids and probabilities of its support).
* ``score_drafts``: the current policy's distributions at every position of given draft completions
  (one forward of ``engine.model`` over prompt + draft).
* ``continue_from``: more tokens after a given prefix of generated tokens (the prefix is appended to
  the prompt), grouped by remaining budget.
* ``cut_at_stop``: a completion assembled from pieces cut where a stop string first ends, as one
  ``generate`` call would have stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from reinforge.errors import ReinforgeError
from reinforge.rollout.sampling import restrict_logits
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

Sparse = tuple[list[int], list[float]]  # (token ids, probabilities) of a distribution's support


def sampling_distribution(logits: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor]:
    """(probabilities the engine samples from, log softmax(z / T)) for logits [..., V] (float32 or wider)."""
    scaled = logits.float() / params.temperature
    logp = torch.log_softmax(scaled, -1)
    probs = torch.softmax(restrict_logits(scaled, params.top_k, params.top_p), -1)
    return probs, logp


def to_sparse(probs: Tensor, max_support: int) -> Sparse | None:
    """A distribution [V] as its support (None when the support is larger than ``max_support``)."""
    ids = probs.nonzero().squeeze(-1)
    if ids.numel() > max_support:
        return None
    return ids.tolist(), probs[ids].tolist()


def to_dense(sparse: Sparse, vocab: int) -> Tensor:
    ids, probs = sparse
    return torch.zeros(vocab).index_put_((torch.tensor(ids, dtype=torch.long),), torch.tensor(probs))


@dataclass
class Recorded:
    """A generation and the sampling distribution of each of its tokens (None: support too large)."""

    generation: Generation
    dists: list[Sparse | None] = field(default_factory=list)


def generate_recording(engine, requests: list[GenerationRequest], params: SamplingParams,
                       max_support: int) -> list[Recorded]:
    """``engine.generate(requests, params)`` with each token's sampling distribution recorded."""
    per_row: dict[int, list[Sparse | None]] = {}

    def on_step(rows: Tensor, logits: Tensor, tokens: Tensor, logprobs: Tensor) -> None:
        probs, _ = sampling_distribution(logits, params)
        for row, p in zip(rows.tolist(), probs, strict=True):
            per_row.setdefault(row, []).append(to_sparse(p, max_support))

    try:
        gens = engine.generate(requests, params, on_step=on_step)
    except TypeError as e:
        raise ReinforgeError(f"this group sampler needs an engine whose generate takes on_step (rollout.engine: "
                             f"torch); {type(engine).__name__} does not ({e})") from None
    return [Recorded(g, per_row.get(i, [])[: len(g.token_ids)]) for i, g in enumerate(gens)]


@torch.no_grad()
def score_drafts(engine, prompts: Sequence[list[int]], drafts: Sequence[list[int]],
                 params: SamplingParams) -> list[tuple[Tensor, Tensor]]:
    """For each (prompt, draft): (probs [D, V], logp [D, V]) of the current policy at the draft's D
    positions (one batched forward of ``engine.model``; right padding keeps every row's positions)."""
    model = getattr(engine, "model", None)
    if model is None:
        raise ReinforgeError(f"this group sampler scores drafts with the engine's model; {type(engine).__name__} "
                             "has none (rollout.engine: torch)")
    seqs = [list(p) + list(d) for p, d in zip(prompts, drafts, strict=True)]
    width = max(len(s) for s in seqs)
    device = next(model.parameters()).device
    ids = torch.full((len(seqs), width), int(engine.pad_id), dtype=torch.long, device=device)
    attention = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
        attention[i, : len(s)] = 1
    probs, logp = sampling_distribution(model(input_ids=ids, attention_mask=attention).logits, params)
    spans = [slice(len(p) - 1, len(p) - 1 + len(d)) for p, d in zip(prompts, drafts, strict=True)]
    return [(probs[i, span], logp[i, span]) for i, span in enumerate(spans)]


def continue_from(engine, prompts: Sequence[list[int]], prefixes: Sequence[list[int]], budgets: Sequence[int],
                  params: SamplingParams, max_support: int, request_ids: Sequence[str] | None = None
                  ) -> list[Recorded]:
    """One completion after each ``prompt + prefix`` of at most ``budget`` tokens (n = 1), recording the
    sampling distributions; one engine call per distinct budget."""
    out: list[Recorded | None] = [None] * len(prompts)
    for budget in sorted(set(budgets)):
        idx = [i for i, b in enumerate(budgets) if b == budget]
        reqs = [GenerationRequest(list(prompts[i]) + list(prefixes[i]), request_ids[i] if request_ids else "")
                for i in idx]
        recs = generate_recording(engine, reqs, dataclasses.replace(params, n=1, max_new_tokens=budget), max_support)
        for i, rec in zip(idx, recs, strict=True):
            out[i] = rec
    return [r for r in out if r is not None]


def cut_at_stop(tokenizer, tokens: list[int], stop: Sequence[str], start: int = 0) -> int | None:
    """The length at which ``tokens`` first ends with a stop string, looking at ends after ``start``
    tokens (None: nowhere). Mirrors the engine's check on the decoded tail (a token holds >= 1
    character, so a window of max(len(stop)) tokens suffices)."""
    if not stop:
        return None
    window = max(len(s) for s in stop)
    for end in range(max(start, 1), len(tokens) + 1):
        text = tokenizer.decode(tokens[max(0, end - window) : end], skip_special_tokens=True)
        if any(text.endswith(s) for s in stop):
            return end
    return None
