"""Learning from expert traces inside RL: LUFFY's mixed-policy loss and CHORD's token-weighted SFT term.

Both train on demonstration rows (``Context.demo``). LUFFY's demonstrations are members of a
sampled group (``demonstrations.placement: in_group``), so the group's advantages include them;
CHORD's are groups of their own, weighed against the RL loss by ``algo.mixing`` (``chord``).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.objective import LOSS_TERMS
from reinforge.algo.policy_losses import POLICY_LOSSES, ClipSettings, ppo_clip_loss


class LuffySettings(ClipSettings):
    """The on-policy tokens' clip range and the policy-shaping constant of the off-policy ones."""

    gamma: float = Field(0.1, gt=0, description="policy shaping f(p) = p / (p + gamma) of the off-policy tokens")


@POLICY_LOSSES.register(
    "luffy",
    formula=("on-policy tokens: L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t); off-policy "
             "(demonstration) tokens: L_t = -f(pi(a_t)) A_t, f(p) = p / (p + gamma); one token mean over both"),
    paper="Yan et al. 2025, LUFFY, Learning to Reason under Off-Policy Guidance (arXiv:2504.14945)",
    settings=LuffySettings,
    needs=("demonstrations",),
)
def luffy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, demo: Tensor | None, cfg: LuffySettings
               ) -> tuple[Tensor, dict[str, Any]]:
    """Mixed-policy GRPO with policy shaping (LUFFY, Eq. 6-7).

    The sampled tokens take the PPO clipped surrogate. A demonstration token's importance ratio
    pi_theta / pi_phi is taken with pi_phi = 1 (the paper's choice: the expert's probabilities are
    unknown and its tokenizer may differ), i.e. the ratio is pi_theta(a_t) itself, and is shaped by
    f(p) = p / (p + gamma) without clipping; grad f = gamma / (p + gamma)^2 * grad p, which raises
    the weight of the expert's low-probability tokens. The advantages are the group's, computed
    over the sampled completions and the demonstration together (``demonstrations.placement:
    in_group``); the objective aggregates both kinds of token in one token mean (the paper's 1/Z).
    Metrics ``guided/prob`` (pi_theta of the expert's tokens) and ``guided/shaping_weight``
    (p * gamma / (p + gamma)^2, the factor on grad log p) average over the demonstration tokens.
    """
    loss, metrics = ppo_clip_loss(logp, old_logp, advantages, cfg)
    metrics.pop("dual_clip_frac")
    if demo is None:
        return loss, metrics
    off = demo.bool()[:, None].expand_as(logp)
    prob = torch.exp(logp)
    shaped = -advantages * prob / (prob + cfg.gamma)
    with torch.no_grad():
        rows = off.to(logp.dtype)
        metrics["guided/prob"] = (prob.detach(), rows)
        metrics["guided/shaping_weight"] = (prob * cfg.gamma / (prob + cfg.gamma) ** 2, rows)
    return torch.where(off, shaped, loss), metrics


@LOSS_TERMS.register(
    "nll_phi",
    formula="+ c * agg_demo(-sg(phi_t) log pi(y_t)), phi_t = p_t (1 - p_t), p_t = pi(y_t)",
    paper="Zhang et al. 2025, CHORD-phi, On-Policy RL Meets Off-Policy Experts (arXiv:2508.11408)",
    needs=("demonstrations",),
)
def nll_phi_term(logp: Tensor, cfg: object) -> tuple[Tensor, dict[str, Tensor]]:
    """CHORD's token-wise weighted SFT loss: each expert token's NLL weighted by phi = p (1 - p)
    (stop-gradient), largest for the tokens the policy is unsure of (p = 1/2) and vanishing for
    tokens it already predicts (p -> 1) or finds implausible (p -> 0). Metrics: ``nll`` and ``phi``
    over the demonstration tokens."""
    prob = torch.exp(logp.detach())
    phi = prob * (1 - prob)
    return -phi * logp, {"nll": -logp.detach(), "phi": phi}
