"""RL-PLUS's hybrid-policy loss: GRPO on the sampled tokens, multiple importance sampling and the
exploration-based advantage on the external (demonstration) tokens.

Dong et al. 2025, "RL-PLUS: Countering Capability Boundary Collapse of LLMs in Reinforcement Learning
with Hybrid-policy Optimization" (arXiv:2508.00222). The external rows are demonstrations placed in a
sampled group (``demonstrations.placement: in_group``, the machinery LUFFY uses, algo/guidance.py),
so the group's advantages are computed over the sampled completions and the demonstration together.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES, ClipSettings, ppo_clip_loss


class RLPlusSettings(ClipSettings):
    """The sampled tokens' clip range, the exploration exponent and the mixture of the MIS denominator."""

    gamma: float = Field(0.5, ge=0, description="exploration exponent: C_t = (1 - sg(pi(a_t)))^gamma on the "
                         "external tokens (the authors' code: 0.5; 0 = no exploration weight)")
    ext_weight: float = Field(0.5, ge=0, le=1, description="weight w of the external policy in the MIS "
                              "denominator (1 - w) pi_old + w pi_ext (the paper's balance heuristic: 1/2)")
    max_ratio: float = Field(0.0, ge=0, description="cap on the external tokens' MIS ratio (0 = none, the "
                             "authors' default)")


def mis_ratio(logp: Tensor, old_logp: Tensor, cfg: RLPlusSettings) -> Tensor:
    """r_t = pi(a_t) / ((1 - w) pi_old(a_t) + w pi_ext(a_t)), pi_ext(a_t) = (pi_old(a_t) + 1) / 2.

    The external policy's probabilities are unknown (a demonstration is given, not sampled: its row
    has no sampling log-probs), so pi_ext is estimated as the authors' code does, halfway between the
    old policy and an expert that is certain of its token. The denominator is held fixed (pi_old has
    no gradient); the gradient flows through pi(a_t) alone. Optional cap ``max_ratio``."""
    old = torch.exp(old_logp.detach())
    ext = (old + 1.0) / 2.0
    ratio = torch.exp(logp) / ((1.0 - cfg.ext_weight) * old + cfg.ext_weight * ext)
    return torch.clamp(ratio, max=cfg.max_ratio) if cfg.max_ratio > 0 else ratio


@POLICY_LOSSES.register(
    "rl_plus",
    formula=("sampled tokens: L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t); external "
             "(demonstration) tokens: L_t = -r_t A_t C_t, r_t = pi(a_t) / ((1-w) pi_old(a_t) + w pi_ext(a_t)), "
             "pi_ext = (pi_old + 1)/2, C_t = (1 - sg(pi(a_t)))^gamma; one token mean over both"),
    paper="Dong et al. 2025, RL-PLUS: Countering Capability Boundary Collapse of LLMs in Reinforcement Learning "
          "with Hybrid-policy Optimization (arXiv:2508.00222)",
    settings=RLPlusSettings,
    needs=("demonstrations",),
)
def rl_plus_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, demo: Tensor | None, cfg: RLPlusSettings
                 ) -> tuple[Tensor, dict[str, Any]]:
    """Hybrid-policy GRPO (RL-PLUS, Eq. for L_RL-PLUS): the sampled tokens take the clipped surrogate;
    an external token takes -r_t * A_t * C_t, with r_t the multiple-importance-sampling ratio
    (``mis_ratio``: the behaviour of an external token is the mixture of the old policy and the
    external policy, which keeps r_t bounded where either gives the token mass) and C_t the
    exploration-based weight of the group advantage, large for the tokens the policy finds
    improbable (stop-gradient). The external tokens are not clipped (the authors' code). Metrics over
    the external tokens: ``guided/prob`` (pi(a_t)), ``guided/mis_ratio`` (r_t) and
    ``guided/explore_weight`` (C_t)."""
    loss, metrics = ppo_clip_loss(logp, old_logp, advantages, cfg)
    metrics.pop("dual_clip_frac")
    if demo is None:
        return loss, metrics
    off = demo.bool()[:, None].expand_as(logp)
    ratio = mis_ratio(logp, old_logp, cfg)
    prob = torch.exp(logp.detach())
    explore = (1.0 - prob).clamp(min=0.0) ** cfg.gamma
    external = -ratio * advantages * explore
    with torch.no_grad():
        rows = off.to(logp.dtype)
        metrics["guided/prob"] = (prob, rows)
        metrics["guided/mis_ratio"] = (ratio.detach(), rows)
        metrics["guided/explore_weight"] = (explore, rows)
    return torch.where(off, external, loss), metrics
