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
* ``continue_budgeted``: ``params.n`` continuations of each (prompt, prefix), each within what is left
  of ``max_new_tokens`` after its prefix, in one engine call (VinePPO's re-rollouts).
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

Sparse = tuple[Tensor, Tensor]  # (token ids, probabilities) of a distribution's support


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
    return ids.cpu(), probs[ids].cpu()


def rows_to_sparse(probs: Tensor, max_support: int) -> list[Sparse | None]:
    """``to_sparse`` of every row of [B, V] (one top-k for the batch)."""
    k = min(max_support, probs.shape[-1])
    vals, idx = probs.topk(k, dim=-1)
    vals, idx = vals.cpu(), idx.cpu()
    counts = (probs > 0).sum(-1).tolist()
    return [(idx[j, :c], vals[j, :c]) if c <= k else None for j, c in enumerate(counts)]


def probability_of(sparse: Sparse, token: int) -> float:
    """The probability ``sparse`` gives ``token`` (0 outside its support)."""
    ids, probs = sparse
    return float(probs[ids == token].sum())


def to_dense(sparse: Sparse, vocab: int) -> Tensor:
    ids, probs = sparse
    return torch.zeros(vocab, dtype=probs.dtype).index_put_((ids.long(),), probs)


def sparse_to_lists(sparse: Sparse | None) -> tuple[list[int], list[float]]:
    """JSON-able form ([], [] for None)."""
    return ([], []) if sparse is None else (sparse[0].tolist(), sparse[1].tolist())


def sparse_from_lists(ids: list[int], probs: list[float]) -> Sparse | None:
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(probs, dtype=torch.float32)) if ids else None


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
        for row, sparse in zip(rows.tolist(), rows_to_sparse(probs, max_support), strict=True):
            per_row.setdefault(row, []).append(sparse)

    try:
        gens = engine.generate(requests, params, on_step=on_step)
    except TypeError as e:
        raise ReinforgeError(f"this group sampler needs an engine whose generate takes on_step (rollout.engine: "
                             f"torch); {type(engine).__name__} does not ({e})") from None
    return [Recorded(g, per_row.get(i, [])[: len(g.token_ids)]) for i, g in enumerate(gens)]


@torch.no_grad()
def score_drafts(engine, prompts: Sequence[list[int]], drafts: Sequence[list[int]],
                 params: SamplingParams) -> tuple[Tensor, Tensor]:
    """(probs, logp), each [B, D_max, V]: the current policy's sampling distribution and log softmax(z / T)
    at every position of each (prompt, draft) (rows past a draft's end are padding); one batched forward
    of ``engine.model`` (right padding keeps every row's positions)."""
    model = getattr(engine, "model", None)
    if model is None:
        raise ReinforgeError(f"this group sampler scores drafts with the engine's model; {type(engine).__name__} "
                             "has none (rollout.engine: torch)")
    keys = [(tuple(p), tuple(d)) for p, d in zip(prompts, drafts, strict=True)]
    unique = list(dict.fromkeys(keys))  # identical drafts of a prompt are scored once
    seqs = [list(p) + list(d) for p, d in unique]
    width, d_max = max(len(s) for s in seqs), max(len(d) for d in drafts)
    device = next(model.parameters()).device
    ids = torch.full((len(seqs), width), int(engine.pad_id), dtype=torch.long, device=device)
    attention = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, device=device)
        attention[i, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits
    # position len(prompt) - 1 + t predicts draft token t
    at = torch.tensor([len(p) - 1 for p, _ in unique], device=device)[:, None] + torch.arange(d_max, device=device)
    rows = logits.gather(1, at.clamp(max=width - 1)[..., None].expand(-1, -1, logits.shape[-1]))
    where = {k: i for i, k in enumerate(unique)}
    return sampling_distribution(rows[torch.tensor([where[k] for k in keys], device=device)], params)


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


def continue_budgeted(engine, prompts: Sequence[list[int]], prefixes: Sequence[list[int]], params: SamplingParams
                      ) -> tuple[list[Generation], int]:
    """``params.n`` continuations of every ``prompt + prefix`` (request order, sample index fastest), each
    of at most ``params.max_new_tokens - len(prefix)`` tokens, and the number of tokens the engine decoded.

    One engine call at the largest budget; a continuation longer than its own budget is cut there and
    ends ``length``, which is what a call at that budget returns (the first b tokens of a sample are
    a sample of b tokens: the engine decides each token from the ones before it). A stop string that
    begins in the prefix and ends in the continuation stops it too (``cut_at_stop``). When the longest
    request plus the largest budget would exceed the model's context, one call per distinct budget.
    Each generation's ``token_ids`` are the continuation's; its ``text`` is the whole completion's
    (prefix and continuation, decoded together), what a verifier scores."""
    budgets = [params.max_new_tokens - len(p) for p in prefixes]
    if min(budgets, default=1) < 1:
        raise ValueError(f"a prefix of {max(map(len, prefixes))} tokens leaves nothing of max_new_tokens="
                         f"{params.max_new_tokens}")
    limit = getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
    longest = max((len(p) + len(q) for p, q in zip(prompts, prefixes, strict=True)), default=0)
    calls = ([list(range(len(prompts)))] if limit is None or longest + max(budgets, default=0) <= limit
             else [[i for i, b in enumerate(budgets) if b == budget] for budget in sorted(set(budgets))])
    out: list[Generation | None] = [None] * (len(prompts) * params.n)
    decoded = 0
    for idx in calls:
        reqs = [GenerationRequest(list(prompts[i]) + list(prefixes[i]), str(i)) for i in idx]
        gens = engine.generate(reqs, dataclasses.replace(params, max_new_tokens=max(budgets[i] for i in idx)))
        decoded += sum(len(g.token_ids) for g in gens)
        for j, g in enumerate(gens):
            i = idx[j // params.n]
            out[i * params.n + j % params.n] = _within(engine.tokenizer, g, list(prefixes[i]), budgets[i], params.stop)
    return [g for g in out if g is not None], decoded


def _within(tokenizer, g: Generation, prefix: list[int], budget: int, stop: Sequence[str]) -> Generation:
    """``g`` cut at its budget and at a stop string ending after the prefix; text of prefix + continuation."""
    n, finish = len(g.token_ids), g.finish_reason
    if n > budget:
        n, finish = budget, "length"
    end = cut_at_stop(tokenizer, prefix + g.token_ids[:n], stop, start=len(prefix) + 1) if stop else None
    if end is not None and end - len(prefix) < n:
        n, finish = end - len(prefix), "stop"
    text = tokenizer.decode(prefix + g.token_ids[:n], skip_special_tokens=True)
    return dataclasses.replace(g, token_ids=g.token_ids[:n], logprobs=g.logprobs[:n], finish_reason=finish,
                               text=text, token_versions=g.token_versions[:n])
