"""Rollout/training mismatch correction.

The rollout engine (sampler, e.g. vLLM or a KV-cached decoder in another precision) and the
learner compute slightly different token probabilities for the same policy weights, so the
"on-policy" samples are in fact off-policy for the learner. With d_t = log pi_learner(a_t) -
log pi_sampler(a_t) the importance ratio is rho_t = pi_learner / pi_sampler = exp(d_t); the
correction reweights (truncated importance sampling) or drops (masking) tokens or whole
sequences whose ratio is far from 1. See Yao et al. 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training" (fengyao.notion.site/off-policy-rl), with truncated IS from
Espeholt et al. 2018, IMPALA (arXiv:1802.01561).

Modes (``cap`` = C > 1; exponents clamped to [-20, 20] before ``exp``):

- ``none``:       w_t = 1
- ``token_tis``:  w_t = min(exp(d_t), C)
- ``seq_tis``:    w_i = min(exp(sum_t m_t d_t), C), broadcast over the row's tokens
- ``token_mask``: w_t = 1 if 1/C <= exp(d_t) <= C else 0
- ``seq_mask``:   w_i = 1 if 1/C <= exp(mean_{t: m_t=1} d_t) <= C else 0 (geometric-mean ratio), broadcast
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from reinforge.registry import Registry, kind

_MAX_LOG = 20.0

# fn(d: Tensor[N,T] (float64, 0 off the mask), m: Tensor[N,T] (the mask, float64), cap) -> (weight, corrected)
CorrectionFn = Callable[[Tensor, Tensor, float], tuple[Tensor, Tensor]]
MISMATCH_CORRECTIONS: Registry[CorrectionFn] = kind("mismatch", Registry("mismatch correction"))
_YAO = "Yao et al. 2025, Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"


@MISMATCH_CORRECTIONS.register("none", formula="w_t = 1", paper=_YAO + " (the statistics only)")
def no_correction(d: Tensor, m: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """No correction: every token keeps weight 1 (the mismatch is still measured)."""
    return m, torch.zeros_like(m)


@MISMATCH_CORRECTIONS.register(
    "token_tis", formula="w_t = min(exp(d_t), C)", paper=_YAO + "; truncated IS: Espeholt et al. 2018, IMPALA")
def token_tis(d: Tensor, m: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Token-level truncated importance sampling."""
    ratio = torch.exp(d)
    return torch.clamp(ratio, max=cap) * m, (ratio > cap).to(torch.float64) * m


@MISMATCH_CORRECTIONS.register("seq_tis", formula="w_i = min(exp(sum_t d_t), C)", paper=_YAO)
def seq_tis(d: Tensor, m: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Sequence-level truncated importance sampling, the weight broadcast over the row's tokens."""
    seq_ratio = torch.exp((d * m).sum(-1).clamp(-_MAX_LOG, _MAX_LOG))
    return torch.clamp(seq_ratio, max=cap)[:, None] * m, (seq_ratio > cap).to(torch.float64)[:, None] * m


@MISMATCH_CORRECTIONS.register("token_mask", formula="w_t = 1 if 1/C <= exp(d_t) <= C else 0", paper=_YAO)
def token_mask(d: Tensor, m: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Token-level masking of tokens whose ratio is outside [1/C, C]."""
    ratio = torch.exp(d)
    keep = (ratio >= 1.0 / cap) & (ratio <= cap)
    return keep.to(torch.float64) * m, (~keep).to(torch.float64) * m


@MISMATCH_CORRECTIONS.register(
    "seq_mask", formula="w_i = 1 if 1/C <= exp(mean_t d_t) <= C else 0", paper=_YAO)
def seq_mask(d: Tensor, m: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Sequence-level masking by the geometric-mean ratio, broadcast over the row's tokens."""
    seq_ratio = torch.exp((d * m).sum(-1) / m.sum(-1).clamp(min=1.0))
    keep = (seq_ratio >= 1.0 / cap) & (seq_ratio <= cap)
    return keep.to(torch.float64)[:, None] * m, (~keep).to(torch.float64)[:, None] * m


MISMATCH_MODES: tuple[str, ...] = tuple(MISMATCH_CORRECTIONS.names())


@torch.no_grad()
def mismatch_correction(
    learner_logp: Tensor, sampling_logp: Tensor, mask: Tensor, mode: str, cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token importance weights correcting the sampler/learner mismatch, and mismatch metrics.

    d_t = learner_logp - sampling_logp; weights per ``mode`` (a ``MISMATCH_CORRECTIONS`` entry). The
    weights are detached: the caller multiplies them into the per-token policy loss. All outputs are 0
    where ``mask`` is 0 (so a zero-length row is all zeros). Metrics, per token (average them over the
    masked tokens):

    - ``is_weight``: the weight w_t.
    - ``is_corrected``: 1 where the correction changed the token's ratio: truncated (ratio > C for
      the TIS modes, the sequence ratio for ``seq_tis``) or masked out (weight 0); zeros for ``none``.
    - ``mismatch_k3``: k3 estimate of KL(pi_sampler || pi_learner). The tokens are sampled from the
      sampler, so KL(sampler || learner) = E_sampler[log sampler - log learner] = E_sampler[-log r]
      with r = pi_learner / pi_sampler = exp(d); since E_sampler[r] = 1, adding r - 1 keeps it
      unbiased and makes every sample non-negative: k3 = (r - 1) - log r = exp(d) - 1 - d.

    Computed in float64, returned in ``learner_logp.dtype``. Raises ``ValueError`` on an unknown
    mode or (unless ``mode == "none"``) a cap <= 1.
    """
    if mode not in MISMATCH_CORRECTIONS:
        raise ValueError(f"unknown mismatch mode {mode!r}; allowed: {', '.join(MISMATCH_CORRECTIONS.names())}")
    if mode != "none" and not cap > 1.0:
        raise ValueError(f"mismatch cap must be > 1 for mode {mode!r}, got {cap}")
    live = mask != 0
    m = live.to(torch.float64)
    d = torch.where(live, (learner_logp.detach() - sampling_logp.detach()).to(torch.float64), 0.0)
    d = d.clamp(-_MAX_LOG, _MAX_LOG)
    weight, corrected = MISMATCH_CORRECTIONS.get(mode)(d, m, cap)
    k3 = (torch.expm1(d) - d) * m
    w = weight.to(learner_logp.dtype)
    metrics = {
        "is_weight": w.clone(),
        "is_corrected": corrected.to(learner_logp.dtype),
        "mismatch_k3": k3.to(learner_logp.dtype),
    }
    return w, metrics
