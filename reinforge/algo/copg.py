"""CoPG: Contrastive Policy Gradient, a squared loss on the regularised-reward gaps of pairs of sequences.

Flet-Berliac et al. 2024, "Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in a
supervised-friendly fashion" (arXiv:2406.19185). With the regularised reward of a sequence

    R_beta(y) = R(y) - beta log(pi(y) / pi_ref(y))     (log-probs summed over the answer's tokens),

the loss of a pair (y, y') of answers to one prompt is (R_beta(y) - R_beta(y'))^2. Its gradient,
-2 beta (R_beta(y) - R_beta(y')) grad log(pi(y) / pi(y')), needs no importance ratio: the pair may come
from any policy (off-policy), and its minimiser over pi is the KL-regularised optimum pi_ref exp(R / beta) / Z
(the paper's Theorem). Used online here over a prompt's k sampled answers, every pair of the group as in
Cohere's Command A report's form of the loss, l_g = 1/(k - 1) sum_{i<j} (R_beta(y_i) - R_beta(y_j))^2:
on-policy its gradient is RLOO's on the regularised reward (times 2 beta).

``normalise`` divides the loss by 2 beta (a change of the learning rate's scale only): each row's gradient
is then -(R_beta(y_i) - mean_{j != i} R_beta(y_j)) grad log pi(y_i), a leave-one-out advantage.

Per token: row i carries v_i = k / (2 (k - 1)) sum_{j in g, j != i} (R_beta(y_i) - R_beta(y_j))^2 spread
evenly over its tokens (the group's rows sum to k l_g), so with ``loss_agg: seq_mean_token_sum`` the loss
is the mean of l_g over the groups. Like ``dpo`` the loss declares ``ref_logp`` and ``whole_groups``.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Settings


class CoPGSettings(Settings):
    """CoPG's KL strength and the optional 1 / (2 beta) scale."""

    beta: float = Field(0.1, gt=0, description="strength of the KL to pi_ref in the regularised reward "
                        "R - beta log(pi/pi_ref)")
    normalise: bool = Field(False, description="divide the loss by 2 beta: each row's gradient is then the "
                            "leave-one-out advantage of the regularised reward (the learning rate's scale only)")


def same_group_pairs(group_index: Tensor) -> Tensor:
    """[N, N] bool: rows i != j of one group (a negative index: a group of its own, no pair)."""
    same = (group_index[:, None] == group_index[None, :]) & (group_index[:, None] >= 0)
    return same & ~torch.eye(len(group_index), dtype=torch.bool, device=group_index.device)


def regularised_rewards(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, beta: float) -> Tensor:
    """R_beta(y_i) = r_i - beta sum_t m_it (log pi - log pi_ref) [N], with gradient through log pi."""
    seq_log_ratio = ((logp - ref_logp) * mask).sum(-1)
    return rewards.to(logp.dtype) - beta * seq_log_ratio


@POLICY_LOSSES.register(
    "copg",
    formula=("l_g = 1/(k-1) sum_{i<j in g} (R_beta(y_i) - R_beta(y_j))^2, R_beta(y) = r(y) - beta log(pi(y)/pi_ref(y)) "
             "(sequence log-probs), k = the group's size; row i carries k/(2(k-1)) sum_{j != i} (R_beta(y_i) - "
             "R_beta(y_j))^2 over its tokens; normalise: divided by 2 beta"),
    paper="Flet-Berliac et al. 2024, Contrastive Policy Gradient: Aligning LLMs on sequence-level scores in a "
          "supervised-friendly fashion (CoPG) (arXiv:2406.19185); all pairs of a group: Cohere 2025, Command A "
          "(arXiv:2504.00698)",
    settings=CoPGSettings,
    needs=("ref_logp", "whole_groups"),
)
def copg_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, group_index: Tensor,
              cfg: CoPGSettings) -> tuple[Tensor, dict[str, Any]]:
    """CoPG over every pair of each group. A group of one row, or whose regularised rewards are all
    equal, gives 0. Metrics: ``copg/gap`` (|R_beta(y_i) - R_beta(y_j)| averaged over each row's pairs)
    and ``copg/log_ratio`` (the row's sequence log(pi/pi_ref)), both over the rows that have a pair."""
    q = regularised_rewards(logp, ref_logp, mask, rewards, cfg.beta)
    pairs = same_group_pairs(group_index).to(q.dtype)
    n_pairs = pairs.sum(-1)
    size = n_pairs + 1
    gap = q[:, None] - q[None, :]
    per_row = size / (2 * n_pairs.clamp(min=1)) * (pairs * gap**2).sum(-1)
    if cfg.normalise:
        per_row = per_row / (2 * cfg.beta)
    loss = per_row[:, None] * mask / mask.sum(-1, keepdim=True).clamp(min=1)
    with torch.no_grad():
        has_pair = (n_pairs > 0)[:, None].expand_as(mask).to(mask.dtype)
        mean_gap = (pairs * gap.abs()).sum(-1) / n_pairs.clamp(min=1)
        log_ratio = ((logp - ref_logp) * mask).sum(-1)
        metrics = {"copg/gap": (mean_gap[:, None].expand_as(mask).to(mask.dtype), has_pair),
                   "copg/log_ratio": (log_ratio[:, None].expand_as(mask).to(mask.dtype), has_pair)}
    return loss, metrics
