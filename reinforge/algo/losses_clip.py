"""Clipping and importance-weight variants of the PPO surrogate (rho_t = pi(a_t) / pi_old(a_t),
sg = stop-gradient): gradients kept where PPO's clip drops them (CE-GPPO), clip bounds that depend
on the token's prior probability (DCPO, with its OTM aggregation), the flipped weight of
positive-advantage tokens (ASPO). The off-policy members with batch statistics (BAPO, M2PO) are in
``losses_offpolicy.py``."""

from __future__ import annotations

import torch
from pydantic import Field, field_validator
from torch import Tensor

from reinforge.algo.losses import LOSS_AGG, POLICY_LOSSES, AggNorm, ClipSettings
from reinforge.registry import Settings


class CEGPPOSettings(ClipSettings):
    """CE-GPPO's clip range, the two gradient scales of the out-of-clip tokens and the dual clip."""

    beta1: float = Field(0.75, ge=0, description="gradient scale of tokens with A < 0 and rho < 1 - eps_low")
    beta2: float = Field(1.0, ge=0, description="gradient scale of tokens with A > 0 and rho > 1 + eps_high")
    dual_clip: float = Field(3.0, ge=0, description="dual-clip constant c > 1 for A < 0 (0 = off)")

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("must be 0 (off) or a constant c > 1 (e.g. 3.0)")
        return v


@POLICY_LOSSES.register(
    "ce_gppo",
    formula=("L_t = -beta1 (1-eps_low) rho_t/sg(rho_t) A_t if A_t < 0 and rho_t < 1-eps_low; "
             "-beta2 (1+eps_high) rho_t/sg(rho_t) A_t if A_t > 0 and rho_t > 1+eps_high; else -rho_t A_t; "
             "A_t < 0: L_t <- min(L_t, -c A_t)"),
    paper="Su et al. 2025, CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization "
          "(arXiv:2509.20712); GPPO: Klear-Reasoner (arXiv:2508.07629)",
    settings=CEGPPOSettings,
)
def ce_gppo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: CEGPPOSettings
                 ) -> tuple[Tensor, dict[str, Tensor]]:
    """Gradient-preserving clipping. Where PPO's clip is active (A < 0 with rho below the range, A > 0
    with rho above it) the forward value is the clipped one, beta x (1 -+ eps) A, but the gradient is
    not zero: rho / sg(rho) has value 1 and gradient grad log pi, so such a token gets
    -beta (1 -+ eps) A grad log pi, a bounded gradient scaled by beta1 (negative advantages: it
    sharpens, counters entropy growth) or beta2 (positive: it explores). The other tokens are PPO's
    unclipped term. Defaults are the paper's released implementation: beta1 0.75, beta2 1.0, dual
    clip c = 3 on A < 0. Metrics: ``clip_frac`` (tokens in the two clipped cases), ``dual_clip_frac``."""
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient grad log pi
    low = (ratio < 1.0 - cfg.clip_low) & (advantages < 0)
    high = (ratio > 1.0 + cfg.clip_high) & (advantages > 0)
    loss = -ratio * advantages
    loss = torch.where(low, -cfg.beta1 * (1.0 - cfg.clip_low) * unit * advantages, loss)
    loss = torch.where(high, -cfg.beta2 * (1.0 + cfg.clip_high) * unit * advantages, loss)
    dual = torch.zeros_like(low)
    if cfg.dual_clip > 0:
        cap = -cfg.dual_clip * advantages
        dual = (advantages < 0) & (cap < loss)
        loss = torch.where(dual, cap.to(loss.dtype), loss)
    with torch.no_grad():
        metrics = {"clip_frac": (low | high).to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype),
                   "ratio": ratio.detach()}
    return loss, metrics


class DCPOSettings(Settings):
    """DCPO's probability-dependent clip bounds (its epsilons) and their cap."""

    clip_low: float = Field(0.16, ge=0, description="eps_low of the bound |(r - 1) p| <= eps below 1")
    clip_high: float = Field(0.2, ge=0, description="eps_high of the bound |(r - 1) p| <= eps above 1")
    max_ratio: float = Field(10.0, gt=1, description="cap of the upper bound and dual clip for A < 0 (r_max)")


def dcpo_bounds(old_logp: Tensor, cfg: DCPOSettings) -> tuple[Tensor, Tensor]:
    """Per-token clip bounds of DCPO from the token's prior probability q = pi_old(a_t):
    0.5 + 0.5 sqrt(max(1 - 4 eps_low / q, 0)) <= r <= min(0.5 + 0.5 sqrt(1 + 4 eps_high / q), r_max)."""
    q = torch.exp(old_logp.detach()).clamp(min=1e-12)
    low = 0.5 + 0.5 * torch.sqrt(torch.clamp(1.0 - 4.0 * cfg.clip_low / q, min=0.0))
    high = torch.clamp(0.5 + 0.5 * torch.sqrt(1.0 + 4.0 * cfg.clip_high / q), max=cfg.max_ratio)
    return low, high


@POLICY_LOSSES.register(
    "dcpo",
    formula=("L_t = -min(rho_t A_t, clip(rho_t, lo(q_t), hi(q_t)) A_t), q_t = pi_old(a_t), "
             "lo = 0.5 + 0.5 sqrt(max(1 - 4 eps_low/q, 0)), hi = min(0.5 + 0.5 sqrt(1 + 4 eps_high/q), r_max); "
             "A_t < 0: L_t <- min(L_t, -r_max A_t)"),
    paper="Yang et al. 2025, DCPO: Dynamic Clipping Policy Optimization (arXiv:2509.02333)",
    settings=DCPOSettings,
)
def dcpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: DCPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Dynamic-adaptive clipping: PPO's surrogate with clip bounds that widen as the token's prior
    probability q falls. The bounds solve |(r - 1) p| <= eps with p = r q (the change of the token's
    probability, not of its ratio, is bounded), so a token with q = 1 keeps ~[0.8, 1.17] and a rare
    one may move far more. The paper caps both sides at r_max = 10 "as the dual clip": here the upper
    bound is capped at r_max and, for A < 0, the loss at -r_max A (PPO's dual clip). Defaults: the
    paper's eps_low 0.16, eps_high 0.2. Metrics: ``clip_frac``, ``ratio``, ``clip_upper`` (mean hi)."""
    ratio = torch.exp(logp - old_logp)
    low, high = dcpo_bounds(old_logp, cfg)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.minimum(torch.maximum(ratio, low), high)
    loss = torch.maximum(unclipped, clipped)
    cap = -cfg.max_ratio * advantages
    dual = (advantages < 0) & (cap < loss)
    loss = torch.where(dual, cap.to(loss.dtype), loss)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype),
                   "ratio": ratio.detach(), "clip_upper": high}
    return loss, metrics


@LOSS_AGG.register(
    "seq_sum_token_mean",
    formula="L = sum_i (sum_t m_it l_it / sum_t m_it)",
    paper="Yang et al. 2025, DCPO's Only-Token-Mean (OTM) loss (arXiv:2509.02333)",
)
def seq_sum_token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """DCPO's OTM: each response's token mean, summed (not averaged) over the responses, so a
    response's weight is its advantage alone, whatever its length and the batch size."""
    return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()


class ASPOSettings(ClipSettings):
    """ASPO's clip range (kept for the token mask) and its soft dual clip."""

    dual_clip: float = Field(3.0, gt=1, description="soft dual clip c: weights above c are set to c, gradient kept")


@POLICY_LOSSES.register(
    "aspo",
    formula=("A_t > 0: L_t = -A_t pi_old pi/sg(pi^2) (= 1/rho_t in value, gradient (1/rho_t) grad log pi), "
             "none if rho_t > 1+eps_high; A_t < 0: L_t = -rho_t A_t, none if rho_t < 1-eps_low; "
             "soft dual clip: a weight above c becomes c rho_t/sg(rho_t)"),
    paper="Wang et al. 2025, ASPO: Asymmetric Importance Sampling Policy Optimization (arXiv:2510.06062)",
    settings=ASPOSettings,
)
def aspo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: ASPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Asymmetric importance sampling. Step 1, token masking: PPO's clip stays (A > 0 with rho above
    1 + eps_high, A < 0 with rho below 1 - eps_low: no gradient). Step 2, weight flipping: a
    positive-advantage token is weighted by 1/rho (pi_old pi / sg(pi^2): value 1/rho, gradient
    (1/rho) grad log pi), so tokens that lag behind pi_old learn faster and already-reinforced ones
    slower; negative tokens keep rho. Step 3, soft dual clip (CISPO-style): a weight above c (1/rho > c
    for A > 0, rho > c for A < 0) is valued c and keeps the gradient c grad log pi. The paper does not
    say whether the negative side's dual clip is soft; the loss we could read (Archer2.0's verl code)
    makes both soft, as here. Defaults: eps 0.2 (the paper), c = 3. Metrics: ``clip_frac`` (masked
    tokens), ``dual_clip_frac``, ``ratio``."""
    ratio = torch.exp(logp - old_logp)
    unit = ratio / ratio.detach()  # value 1, gradient grad log pi
    pos, neg = advantages > 0, advantages < 0
    masked = (pos & (ratio > 1.0 + cfg.clip_high)) | (neg & (ratio < 1.0 - cfg.clip_low))
    weight = torch.where(pos, 1.0 / ratio.detach(), ratio.detach())  # the token's weight, flipped for A > 0
    dual = ~masked & (pos | neg) & (weight > cfg.dual_clip)
    weight = torch.where(dual, torch.full_like(weight, cfg.dual_clip), weight)
    active = -advantages * weight * unit
    frozen = -advantages * torch.where(pos, 1.0 / (1.0 + cfg.clip_high), 1.0 - cfg.clip_low)  # masked: no gradient
    loss = torch.where(masked, frozen.to(active.dtype), active)
    with torch.no_grad():
        metrics = {"clip_frac": masked.to(logp.dtype), "dual_clip_frac": dual.to(logp.dtype), "ratio": ratio.detach()}
    return loss, metrics
