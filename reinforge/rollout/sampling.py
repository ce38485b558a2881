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


def draw_categorical(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row drawn from ``probs`` (rows of non-negative weights) by inverting the CDF:
    the first index whose cumulative weight exceeds u * total, u ~ U[0, 1).

    One uniform per row and one cumulative sum, against ``torch.multinomial``'s exponential noise
    for every entry (a draw from a 49k vocabulary costs ~20 softmax passes there). Indices of zero
    weight are never returned: the search is capped at the last index with weight.
    """
    cdf = probs.cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    index = torch.searchsorted(cdf, u * total, right=True)
    last_with_weight = (cdf < total).sum(-1, keepdim=True)  # cdf reaches the total at the last weighted index
    return torch.minimum(index, last_with_weight).squeeze(-1)


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
        if top_k > 0 or top_p < 1.0:
            probs = torch.softmax(restrict_logits(scaled, top_k, top_p), -1)
        else:
            probs = logp.exp()  # the same distribution, without a second softmax
        tokens = draw_categorical(probs, generator)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
