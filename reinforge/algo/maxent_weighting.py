"""MGPO's MaxEnt-guided problem weights: each group's advantages scaled by how close its accuracy is
to maximal uncertainty (p = 0.5), VibeThinker's signal phase.

    D_ME(p || 0.5) = p ln(2p) + (1 - p) ln(2(1 - p))   (0 ln 0 = 0; in [0, ln 2])
    w_g = exp(-lambda D_ME(p_g || 0.5)),  A'_i = w_g A_i^GRPO

p_g is the fraction of correct rows (reward >= ``correct_threshold``) in row i's group. The weight is 1
at p_g = 0.5 and exp(-lambda ln 2) = 2^-lambda at p_g in {0, 1} (where GRPO's advantage is 0 anyway
for 0/1 rewards); in between it falls smoothly, so a problem the policy nearly always or nearly never
solves counts less than one at its learning frontier.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, GroupNormSettings, grpo_advantage
from reinforge.algo.kl_adaptive import group_accuracy


def maxent_deviation(p: Tensor) -> Tensor:
    """D_ME(p || 0.5) = p ln(2p) + (1 - p) ln(2(1 - p)) elementwise (float64; 0 ln 0 = 0): the KL divergence
    of the Bernoulli(p) correctness distribution from the maximum-entropy Bernoulli(0.5)."""
    p = p.to(torch.float64)
    q = 1.0 - p
    pos = torch.where(p > 0, p * torch.log(2.0 * p.clamp(min=1e-300)), torch.zeros_like(p))
    neg = torch.where(q > 0, q * torch.log(2.0 * q.clamp(min=1e-300)), torch.zeros_like(q))
    return pos + neg


class MGPOSettings(GroupNormSettings):
    """GRPO's options, MGPO's lambda and what counts as a correct answer."""

    mgpo_lambda: float = Field(1.0, ge=0, description="lambda of the weight exp(-lambda D_ME(p || 0.5)): 0 is GRPO, "
                               "larger concentrates the update on the groups near 50% accuracy")
    correct_threshold: float = Field(1.0, description="a sample with reward >= this is correct")


@ADVANTAGES.register(
    "mgpo",
    formula=("A_i = w_g A_i^grpo, w_g = exp(-lambda D_ME(p_g)), D_ME(p) = p ln(2p) + (1 - p) ln(2(1 - p)), "
             "p_g = fraction of correct rows in the group"),
    paper="Xu et al. 2025, Tiny Model, Big Logic: Diversity-Driven Optimization Elicits Large-Model Reasoning "
          "Ability in VibeThinker-1.5B (MaxEnt-Guided Policy Optimization, arXiv:2511.06221)",
    settings=MGPOSettings,
)
def mgpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: MGPOSettings,
                   token_rewards: Tensor | None = None) -> Tensor:
    """MGPO: GRPO's advantage of every row of a problem's group multiplied by the entropy-deviation
    weight of the group's accuracy p_g, w = exp(-lambda KL(Bernoulli(p_g) || Bernoulli(0.5))): 1 for a
    group at 50% accuracy, 2^-lambda at 0% or 100%. The weight multiplies the whole advantage (the
    token-reward returns included). Choices: p_g is the fraction of rows with reward >= ``correct_threshold``
    (the paper's accuracy of the rollouts on the problem; for 0/1 rewards the mean reward); a row outside
    any group (group id < 0) takes its own correctness as p; lambda's default 1.0 is this
    project's."""
    adv = grpo_advantage(rewards, group_index, mask, cfg, token_rewards).to(torch.float64)
    _, acc = group_accuracy(rewards, group_index, cfg.correct_threshold)
    w = torch.exp(-cfg.mgpo_lambda * maxent_deviation(acc))
    return (adv * w[:, None]).to(mask.dtype)
