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


CDF_BLOCK = 1024  # entries per block of the two-level draw


def draw_categorical(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row of ``probs`` (rows of non-negative weights, not necessarily normalised),
    drawn with probability ``p_i / sum(p)``: inverse-CDF sampling in two levels, two uniforms a row.

    The row is cut into blocks of ``CDF_BLOCK`` entries. Level 1 draws block b with probability
    ``S_b / sum(S)`` (``S_b`` its weight, summed in float64): the first b with ``C_b > u_1 sum(S)``,
    ``C`` the cumulative block weights. Level 2 draws entry j of that block with probability
    ``p_j / S_b`` the same way from the block's own float64 cumulative sum and ``u_2``. Together:
    ``P(i) = S_b / sum(S) * p_i / S_b = p_i / sum(p)``, exact up to float64 rounding of the sums.
    An entry of weight 0 is never drawn (its cumulative sum equals its predecessor's, so it is never
    the first to exceed the target; a target rounded up to the total is moved to the last entry of
    weight > 0). Cost: one float64 reduction over the row plus ``CDF_BLOCK`` entries, and 2 random
    numbers a row (the exponential race of ``torch.multinomial`` draws one per entry: on a [64, 49152]
    decode step that was most of the sampler's time). Rows without weight (all 0 or NaN) are not
    defined; they return some index.
    """
    rows, width = probs.shape
    u = torch.rand(rows, 2, dtype=torch.float64, generator=generator, device=probs.device)
    if width <= CDF_BLOCK:  # one block: level 2 alone
        return _inverse_cdf(probs.to(torch.float64), u[:, 1:])
    full = width // CDF_BLOCK
    sums = probs[:, : full * CDF_BLOCK].reshape(rows, full, CDF_BLOCK).sum(-1, dtype=torch.float64)
    if width % CDF_BLOCK:
        sums = torch.cat([sums, probs[:, full * CDF_BLOCK :].sum(-1, keepdim=True, dtype=torch.float64)], 1)
    block = _inverse_cdf(sums, u[:, :1])
    cols = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK, device=probs.device)
    weights = probs.gather(1, cols.clamp(max=width - 1)).masked_fill(cols >= width, 0).to(torch.float64)
    return block * CDF_BLOCK + _inverse_cdf(weights, u[:, 1:])


def _inverse_cdf(weights: Tensor, u: Tensor) -> Tensor:
    """Per row of ``weights`` [R, K] (float64, >= 0): the first index whose cumulative sum exceeds
    ``u * total`` (``u`` [R, 1] in [0, 1)), never past the last index of weight > 0."""
    cdf = weights.cumsum(-1)
    total = cdf[:, -1:]
    index = torch.searchsorted(cdf, u * total, right=True)
    last = (cdf < total).sum(-1, keepdim=True)  # the last index with weight: where the sum reaches the total
    return torch.minimum(index, last)[:, 0]


def sample_tokens(
    logits: Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """Draw one token per row; return (token ids [B], log-probs [B] under softmax(logits / T)).

    The log-prob is ``z_y - logsumexp(z)`` with ``z = logits / T`` before any top-k/top-p restriction
    (greedy decoding: T = 1): a reduction over the row instead of a second [B, V] pass, exact where a
    probability underflows, and no host synchronisation.
    """
    logits = at_least_float32(logits)
    if greedy:
        tokens = logits.argmax(-1)
        return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, -1)
    scaled = logits / temperature if temperature != 1.0 else logits
    restricted = restrict_logits(scaled, top_k, top_p)
    probs = torch.softmax(restricted, -1)
    tokens = draw_categorical(probs, generator)
    return tokens, scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)
