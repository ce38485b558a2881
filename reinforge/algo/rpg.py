"""RPG-REINFORCE: a KL-regularised REINFORCE loss whose weight carries the KL's gradient, with RPG-Style Clip.

Zhang et al. 2025, "On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning"
(arXiv:2505.17508). The RPG view writes the gradient of E[R] - beta D(pi_theta, pi_old) under samples of
pi_old as E_old[(w A + k(w)) grad log pi_theta], w = pi_theta / pi_old, so a REINFORCE-style loss
L = -sg(w A + k) log pi has the exact gradient of the regularised objective. The KL weight k per
divergence (the authors' ``compute_policy_loss_reinforce``, u = clip(w, 1 - eps_low, 1 + eps_high)):

    kl     D                                         k
    fkl    KL(pi_old || pi)        (forward)         beta
    rkl    KL(pi || pi_old)        (reverse)         -beta u (log u + 1)
    ufkl   UKL(pi_old || pi)       (unnormalised)    beta (1 - u)
    urkl   UKL(pi || pi_old)       (unnormalised)    -beta u log u

The unnormalised KL, UKL(p || q) = sum p log(p/q) - p + q, is the one the k3 penalty estimates.

RPG-Style Clip (``clip: dual``, the paper's Sec. 3.3 / 4.1 and the authors' ``clip_ppo``): PPO's
dual-clip token mask on the REINFORCE gradient. A token is kept (M_t = 1) when A_t > 0 and
w_t < 1 + eps_high, or A_t <= 0 and 1 - eps_low <= w_t < c; the others get no gradient. ``clip: hard``
(the authors' plain ``rf`` loss) keeps every token and puts the clipped u in the weight instead of w.

The reference of the KL is pi_old, the policy that sampled the batch: the paper's iterative reference
update (Algorithm 1: "Reference policy pi_old"), so the KL bounds how far one update moves. A fixed
reference model's KL is the ``kl`` loss term's (``algo.kl``), as for any policy loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES, ClipSettings, bounded_log_ratio


class RPGSettings(ClipSettings):
    """RPG-REINFORCE's divergence, its strength, the clip of the ratio and RPG-Style Clip's dual bound."""

    kl: Literal["fkl", "rkl", "ufkl", "urkl"] = Field(
        "ufkl", description="the divergence to pi_old: forward/reverse, normalised (fkl, rkl) or not (ufkl, urkl)")
    beta: float = Field(1e-4, ge=0, description="strength of the KL regularisation (the paper's runs: 1e-4)")
    clip: Literal["dual", "hard"] = Field(
        "dual", description="dual: RPG-Style Clip (PPO's dual-clip mask on the REINFORCE gradient); hard: the "
        "clipped ratio u in the weight, every token kept")
    dual_clip: float = Field(3.0, gt=1, description="c of RPG-Style Clip: tokens with A <= 0 and w >= c get no "
                             "gradient (the authors' default 3; their recipes 10)")
    clip_high: float = Field(0.28, ge=0, description="upper clip range: w is clipped at 1 + clip_high (the "
                             "paper's 0.28)")


def _kl_weight(u: Tensor, kind: str, beta: float) -> Tensor:
    """k(u): the KL's part of the REINFORCE weight, u the clipped ratio (see the module's table)."""
    log_u = torch.log(u)
    weights = {
        "fkl": lambda: torch.full_like(u, beta),
        "rkl": lambda: -beta * u * (log_u + 1.0),
        "ufkl": lambda: beta * (1.0 - u),
        "urkl": lambda: -beta * u * log_u,
    }
    return weights[kind]()


def rpg_keep_mask(ratio: Tensor, advantages: Tensor, cfg: RPGSettings) -> Tensor:
    """RPG-Style Clip's mask: A > 0 and w < 1 + eps_high, or A <= 0 and 1 - eps_low <= w < c."""
    pos = (advantages > 0) & (ratio < 1.0 + cfg.clip_high)
    neg = (advantages <= 0) & (ratio >= 1.0 - cfg.clip_low) & (ratio < cfg.dual_clip)
    return pos | neg


@POLICY_LOSSES.register(
    "rpg",
    formula=("L_t = -M_t sg(w_t A_t + k_t) log pi(a_t), w_t = pi(a_t)/pi_old(a_t), u_t = clip(w_t, 1-eps_low, "
             "1+eps_high), k_t = beta (fkl), -beta u (log u + 1) (rkl), beta (1 - u) (ufkl), -beta u log u (urkl); "
             "clip dual: M_t = [A_t > 0 and w_t < 1+eps_high] or [A_t <= 0 and 1-eps_low <= w_t < c]; "
             "clip hard: M_t = 1 and u_t in place of w_t"),
    paper="Zhang et al. 2025, On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning (RPG) "
          "(arXiv:2505.17508)",
    settings=RPGSettings,
)
def rpg_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: RPGSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """RPG-REINFORCE with RPG-Style Clip. The weight sg(w A + k) is the regularised advantage times the
    importance ratio: its gradient is exactly the KL-regularised objective's on the tokens the mask keeps.
    With ``clip: hard`` the weight is sg(u A + k) on every token (the authors' unclipped-mask ``rf`` loss).
    The loss's value is the weight times -log pi (a REINFORCE surrogate: only its gradient is meaningful).
    Metrics: ``clip_frac`` (tokens outside the mask, or whose ratio the hard clip moved), ``ratio``,
    ``rpg/kl_weight`` (k_t)."""
    ratio = torch.exp(bounded_log_ratio(logp, old_logp)).detach()
    u = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    k = _kl_weight(u, cfg.kl, cfg.beta)
    if cfg.clip == "dual":
        keep = rpg_keep_mask(ratio, advantages, cfg)
        weight = (ratio * advantages + k) * keep.to(logp.dtype)
        clipped = ~keep
    else:
        weight = u * advantages + k
        clipped = u != ratio
    loss = -weight.detach() * logp
    with torch.no_grad():
        metrics = {"clip_frac": clipped.to(logp.dtype), "ratio": ratio, "rpg/kl_weight": k}
    return loss, metrics
