"""Regression-style objectives: the policy's sequence log-ratio to the reference is fitted to a target
derived from the outcome reward, instead of weighing log pi by an advantage.

* A*-PO (``astar_po``): least squares of beta2 * log(pi/pi_ref)(y|x) onto the optimal advantage
  r(x, y) - V*(x), with V*(x) = beta1 * log mean_i exp(r(x, y_i) / beta1) estimated once per prompt
  from N samples of the reference policy (``optimal_value``: the loop's estimate, in ``baseline``;
  orchestrate/value_estimates.py). One on-policy sample per prompt is enough.
* PACS (``pacs``): the outcome reward is a label, psi = beta * log(pi/pi_ref) of the sequence minus the
  mean of the other group members' (leave-one-out) is its logit; binary cross-entropy.

Both losses are per sequence; a sequence's loss is placed on each of its trained tokens, so
``loss_agg: seq_mean_token_mean`` gives exactly the mean over sequences (the papers' reduction).
Log-ratios are summed over the sequence's trained tokens (a sequence log-probability).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.errors import ConfigError
from reinforge.registry import Settings


def soft_optimal_value(rewards: Tensor, beta: float) -> Tensor:
    """V*(x) = beta * log((1/N) sum_i exp(r_i / beta)) of each row of ``rewards`` [P, N] (N reference
    samples per prompt), computed stably with logsumexp: the value of the KL-regularised optimal
    policy pi*(y|x) ~ pi_ref(y|x) exp(r(x, y) / beta), estimated by Monte Carlo from pi_ref."""
    r = rewards.to(torch.float64)
    return beta * (torch.logsumexp(r / beta, dim=-1) - math.log(r.shape[-1]))


def sequence_log_ratio(logp: Tensor, anchor_logp: Tensor, mask: Tensor) -> Tensor:
    """[N]: sum_t m_t (log pi(y_t) - log pi_anchor(y_t)), the sequence log-ratio log(pi/pi_anchor)(y|x)."""
    return ((logp - anchor_logp) * mask).sum(-1)


def _on_tokens(per_seq: Tensor, mask: Tensor) -> Tensor:
    """A per-sequence value [N] on each trained token [N, T] (zero off the mask)."""
    return per_seq[:, None].to(mask.dtype) * mask


class AStarPOSettings(Settings):
    beta1: float = Field(0.5, gt=0, description="stage 1: temperature of V* = beta1 log mean exp(r / beta1) "
                         "over the reference samples")
    beta2: float = Field(1e-3, gt=0, description="stage 2: scale of the implicit reward beta2 log(pi/pi_ref)")
    value_samples: int = Field(8, ge=1, description="stage 1: reference samples per prompt (N) to estimate V*")
    skip_unsolved: bool = Field(True, description="stage 1: no loss on prompts none of whose N reference "
                                "samples has a positive reward (the paper's filter of all-incorrect prompts)")


@POLICY_LOSSES.register(
    "astar_po",
    formula=("L_i = (beta2 log(pi(y_i)/pi_ref(y_i)) - (r_i - V*(x_i)))^2, "
             "V*(x) = beta1 log mean_{j<=N} exp(r(x, y_j)/beta1), y_j ~ pi_ref (per prompt, once)"),
    paper=("Brantley et al. 2025, Accelerating RL for LLM Reasoning with Optimal Advantage Regression (A*-PO) "
           "(arXiv:2505.20686)"),
    settings=AStarPOSettings,
    needs=("ref_logp", "optimal_value"),
)
def astar_po_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: Tensor, baseline: Tensor | None,
                  cfg: AStarPOSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """A*-PO stage 2: regress the implicit reward beta2 log(pi/pi_ref)(y|x) of one on-policy sample
    onto the optimal advantage r - V*(x). ``baseline`` holds V*(x) per sequence, the loop's stage-1
    estimate from the reference (it declares ``optimal_value``). dL_i/dlog pi(y_it) =
    2 beta2 (beta2 h_i - (r_i - V*)): a sample better than V* (and not yet at its target) is pushed
    up, a worse one down, and the push stops once the log-ratio reaches (r - V*) / beta2, the
    KL-regularised optimum: the regression is its own trust region (no clipping, no pi_old).
    Metrics: ``regression/implicit_reward`` (beta2 h_i), ``regression/target`` (r_i - V*)."""
    if baseline is None:
        raise ConfigError("algo.policy_loss=astar_po needs V*(x) per prompt (optimal_value): the "
                          "prompt-values stage estimates it (orchestrate/stages.py) when the part declares it")
    implicit = cfg.beta2 * sequence_log_ratio(logp, ref_logp, mask)
    target = (rewards - baseline).to(implicit.dtype)
    loss = (implicit - target) ** 2
    with torch.no_grad():
        metrics = {"regression/implicit_reward": _on_tokens(implicit.detach(), mask),
                   "regression/target": _on_tokens(target, mask)}
    return _on_tokens(loss, mask), metrics


class PACSSettings(Settings):
    beta: float = Field(1.0, gt=0, description="scale of the reward proxy beta log(pi/pi_anchor)")
    anchor: Literal["ref", "old"] = Field("ref", description="the log-ratio's denominator: ref (the paper's "
                                         "pi_ref) or old (pi_old, as the released code's old_log_prob)")
    balance: bool = Field(True, description="class-balanced weights per group (the released scripts' "
                          "use_weight, weight_mode=question): positives and negatives of a group weigh alike")


def leave_one_out(values: Tensor, group_index: Tensor) -> Tensor:
    """values_i - mean_{j != i in i's group} values_j (RLOO); every group needs two members or more."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    if bool((counts < 2).any()):
        raise ValueError("a leave-one-out baseline needs groups of 2 samples or more (rollout.group_size >= 2)")
    sums = torch.zeros(len(counts), dtype=values.dtype).index_add(0, inverse, values)
    size = counts[inverse].to(values.dtype)
    return values - (sums[inverse] - values) / (size - 1)


def balanced_weights(labels: Tensor, group_index: Tensor) -> Tensor:
    """Per row, G / (2 n_c) in a group of G rows with n_c rows of the row's class (label > 0.5 or not)
    when the group holds both classes, else 1 (scikit-learn's "balanced" class weights per group)."""
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    positive = (labels > 0.5).to(torch.float64)
    n_pos = torch.zeros(len(counts), dtype=torch.float64).index_add(0, inverse, positive)[inverse]
    size = counts[inverse].to(torch.float64)
    n_same = torch.where(positive > 0, n_pos, size - n_pos)
    mixed = (n_pos > 0) & (n_pos < size)
    return torch.where(mixed, size / (2 * n_same.clamp(min=1)), torch.ones_like(size))


@POLICY_LOSSES.register(
    "pacs",
    formula=("L_i = -w_i [r_i log sigmoid(psi_i) + (1-r_i) log(1 - sigmoid(psi_i))], psi_i = rhat_i - "
             "mean_{j != i} rhat_j, rhat_i = beta log(pi(y_i)/pi_ref(y_i)) (group of i)"),
    paper=("Li et al. 2025, Implicit Actor Critic Coupling via a Supervised Learning Framework for RLVR (PACS) "
           "(arXiv:2509.02522)"),
    settings=PACSSettings,
    needs=("ref_logp", "whole_groups"),
)
def pacs_loss(logp: Tensor, ref_logp: Tensor, old_logp: Tensor, mask: Tensor, rewards: Tensor,
              group_index: Tensor, cfg: PACSSettings) -> tuple[Tensor, dict[str, Any]]:
    """PACS: the verifier's reward r in [0, 1] is the label of a classifier whose logit is psi, the
    leave-one-out (RLOO) centred reward proxy of the policy itself. dL_i/dpsi_i = w_i (sigmoid(psi_i)
    - r_i): a correct sample whose psi is not yet high is pushed up, an incorrect one down, each by
    how far the policy's own score is from its label (the critic's error), and through the
    leave-one-out term every other member of the group moves the other way by 1/(G-1) of it.
    ``balance``: class-balanced weights per group. Needs ``whole_groups`` (psi reads the group).
    Metrics: ``pacs/psi``, ``pacs/accuracy`` (sign of psi agrees with the label)."""
    if bool(((rewards < 0) | (rewards > 1)).any()):
        raise ValueError("pacs: rewards are labels of a binary cross-entropy and must lie in [0, 1]")
    anchor = ref_logp if cfg.anchor == "ref" else old_logp
    psi = leave_one_out(cfg.beta * sequence_log_ratio(logp, anchor, mask), group_index)
    labels = rewards.to(psi.dtype)
    loss = F.binary_cross_entropy_with_logits(psi, labels, reduction="none")
    if cfg.balance:
        loss = loss * balanced_weights(labels, group_index).to(psi.dtype)
    with torch.no_grad():
        metrics = {"pacs/psi": _on_tokens(psi.detach(), mask),
                   "pacs/accuracy": _on_tokens(((psi > 0) == (labels > 0.5)).to(psi.dtype), mask)}
    return _on_tokens(loss, mask), metrics
