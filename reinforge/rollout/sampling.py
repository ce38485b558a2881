"""Token sampling on tensors: temperature, top-k, top-p (nucleus), greedy."""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.models.precision import at_least_float32


def restrict_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set to -inf every logit outside the top-k and outside the smallest nucleus of mass >= top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


RACE_BOUND_SLACK = 1e-5  # an exact score exceeds its rounded bound p / u by at most ~3 float32 ulps (~4e-7)


def draw_categorical(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row of ``probs`` (rows of non-negative weights): ``torch.multinomial(probs, 1)``'s
    draw, index for index, leaving ``generator`` in the same state, at a fraction of its cost.

    ``torch.multinomial`` with one sample is the exponential race (the Gumbel-max trick):
    ``argmax_i p_i / E_i`` with ``E_i = -log1p(-U_i)``, ``U_i ~ U[0, 1)`` drawn in float64 from the
    generator and ``E_i`` rounded to ``probs``' dtype; most of its cost is the logarithm of every
    entry. Here the uniforms are drawn the same way (``torch.rand`` in float64 consumes the
    generator as ``exponential_`` does) and ``race_winner`` finds the same winner with the
    logarithm of a handful of entries. Bit-identical to ``torch.multinomial`` on CPU; on another
    device an exact sampler of the same distribution with that device's random stream.
    """
    return race_winner(probs, torch.rand(probs.shape, dtype=torch.float64, generator=generator, device=probs.device))


def race_winner(probs: Tensor, u: Tensor) -> Tensor:
    """``argmax(probs / E, -1)`` with ``E = (-log1p(-u)).to(probs.dtype)`` (first index among equal
    scores, NaN above everything, as ``argmax``), computing ``E`` only where the winner can be.

    ``-log1p(-u) >= u``, so ``p_i / u_i`` bounds entry i's score from above. The exact score at
    the argmax of that bound is a lower bound of the row's winning score, so only entries whose
    bound reaches it (with ``RACE_BOUND_SLACK`` for float32 rounding) can win; those alone are
    scored exactly, and the row's winner is picked among them on the flat list of contenders.
    A NaN score (0 / 0: p = 0 and u = 0) has a NaN bound, which ``argmax`` puts first: it is the lead.
    """
    rows, width = probs.shape
    bound = u.to(probs.dtype)
    torch.div(probs, bound, out=bound)  # in probs' dtype: a float32 / float64 mix is ~8x slower on CPU
    lead = bound.argmax(-1)
    row_ids = torch.arange(rows, device=probs.device)
    floor = _race_scores(probs[row_ids, lead], u[row_ids, lead])
    r, c = (bound >= (floor * (1 - RACE_BOUND_SLACK))[:, None]).nonzero(as_tuple=True)
    r, c = torch.cat([row_ids, r]), torch.cat([lead, c])  # the lead always runs (its bound may be NaN)
    scores = _race_scores(probs[r, c], u[r, c])
    nan = scores.isnan()
    key = torch.where(nan, float("inf"), scores)
    best = torch.full((rows,), float("-inf"), dtype=key.dtype, device=key.device).scatter_reduce(0, r, key, "amax")
    row_has_nan = torch.zeros(rows, dtype=torch.bool, device=key.device).index_fill_(0, r[nan], True)
    wins = torch.where(row_has_nan[r], nan, (key == best[r]) & ~nan)
    first = torch.full((rows,), width, dtype=c.dtype, device=c.device)
    return first.scatter_reduce(0, r[wins], c[wins], "amin")


def _race_scores(p: Tensor, u: Tensor) -> Tensor:
    """``p / E`` with ``E = -log1p(-u)`` rounded to ``p``'s dtype (torch's CPU ``exponential_``)."""
    return p / (-torch.log1p(-u)).to(p.dtype)


def sample_tokens(
    logits: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row; return (token ids [B], log-probs [B] under softmax(logits / T)).

    Greedy decoding reports log-probs under softmax(logits) (T = 1).
    """
    logits = at_least_float32(logits)
    if greedy:
        tokens = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
    else:
        scaled = logits / temperature if temperature != 1.0 else logits
        logp = torch.log_softmax(scaled, -1)
        probs = torch.softmax(restrict_logits(scaled, top_k, top_p), -1)
        tokens = draw_categorical(probs, generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
