"""Speculative verification of a draft (pure tensor math): which draft tokens the current policy keeps.

Speculative sampling (Leviathan et al. 2023, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318):
a draft token x_t drawn from q_t(.) is accepted with probability

    a_t = min(1, pi_t(x_t) / q_t(x_t)),

verification stops at the first rejection t*, and position t* is resampled from the residual

    r(y) = max(0, pi_t*(y) - q_t*(y)) / sum_y' max(0, pi_t*(y') - q_t*(y')).

Then the accepted tokens followed by the resampled one are distributed exactly as tokens sampled
from pi, whatever q was. SPEC-RL (Liu et al. 2025, arXiv:2509.23232) verifies an earlier rollout this
way with a lenience l >= 1: a_t = min(1, l * pi_t(x_t) / q_t(x_t)), and resumes generation at t*
from pi itself; both changes bias the sample towards the draft (``lenient=True`` here).
"""

from __future__ import annotations

import torch
from torch import Tensor


def acceptance_probability(p_token: Tensor, q_token: Tensor, lenience: float = 1.0) -> Tensor:
    """a_t = min(1, l * p(x_t) / q(x_t)) for the draft tokens' probabilities under the current (p) and
    drafting (q) distributions; q(x_t) > 0 (x_t was drawn from q)."""
    return torch.clamp(lenience * p_token / q_token.clamp(min=torch.finfo(q_token.dtype).tiny), max=1.0)


def first_rejection(p_token: Tensor, q_token: Tensor, uniforms: Tensor, lenience: float = 1.0,
                    lengths: Tensor | None = None) -> Tensor:
    """For drafts [B, D] (or one draft [D]): the index of the first rejected token (u_t >= a_t), or the
    draft's length (``lengths`` [B], default D) when all are kept."""
    one = p_token.dim() == 1
    p_token, q_token, uniforms = (x.reshape(-1, x.shape[-1]) for x in (p_token, q_token, uniforms))
    full = torch.full((p_token.shape[0],), p_token.shape[1], dtype=torch.long)
    lengths = full if lengths is None else lengths
    rejected = uniforms >= acceptance_probability(p_token, q_token, lenience)
    rejected &= torch.arange(p_token.shape[1])[None] < lengths[:, None]
    first = torch.where(rejected.any(1), rejected.to(torch.int64).argmax(1), lengths)
    return first[0] if one else first


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)) over the vocabulary; p itself when p <= q everywhere (then no rejection can
    happen in exact arithmetic: only rounding gets here)."""
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    return residual / total if float(total) > 0 else p
