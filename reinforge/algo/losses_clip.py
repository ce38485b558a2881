"""Clipping and importance-weight variants of the PPO surrogate (rho_t = pi(a_t) / pi_old(a_t),
sg = stop-gradient): gradients kept where PPO's clip drops them."""

from __future__ import annotations

import torch
from pydantic import Field, field_validator
from torch import Tensor

from reinforge.algo.losses import POLICY_LOSSES, ClipSettings


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
