"""Advantage estimators: rewards (and values) -> per-token advantages.

Signature of every estimator (registered in ``ADVANTAGES``)::

    fn(rewards: Tensor[N], group_index: Tensor[N] (long), mask: Tensor[N, T],
       values: Tensor[N, T] | None, cfg: AlgoConfig) -> Tensor[N, T]

``group_index[i]`` names the prompt that sequence ``i`` answers (its group); the result is zero
wherever ``mask`` is zero.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor

from reinforge.algo.registry import Registry


class AdvantageFn(Protocol):
    def __call__(
        self, rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
    ) -> Tensor: ...


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def group_mean_std(values: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-element group mean, unbiased group std (0 for groups of one) and group size."""
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    values = values.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, torch.ones_like(values))
    total = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, values)
    mean = (total / count)[group_index]
    sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, group_index, (values - mean) ** 2)
    var = sq / (count - 1).clamp(min=1)
    return mean, var.sqrt()[group_index], count[group_index]


@ADVANTAGES.register(
    "grpo",
    formula="A_i = (r_i - mean_g(r)) / (std_g(r) + eps)  [std scaling optional], broadcast to every token",
    paper="Shao et al. 2024, DeepSeekMath (arXiv:2402.03300)",
)
def grpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any) -> Tensor:
    """Group-relative advantage (GRPO, outcome supervision).

    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps), with the unbiased std;
    without ``cfg.scale_by_std`` only the mean is subtracted. Every token of sequence i gets A_i.
    A group of one sample, or one whose rewards are all equal, gets advantage 0.
    """
    mean, std, _ = group_mean_std(rewards, group_index)
    adv = rewards.to(torch.float64) - mean
    if cfg.scale_by_std:
        adv = adv / (std + cfg.adv_eps)
    return _per_token(adv, mask)


def _per_token(adv: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a per-sequence float64 advantage ``[N]`` to ``[N, T]``, zero where ``mask`` is 0."""
    return adv.to(mask.dtype)[:, None] * mask


def _batch_mean_std(values: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and population (biased, divide-by-N) std of a 1-D float64 tensor; 0, 0 when empty."""
    if values.numel() == 0:
        zero = values.new_zeros(())
        return zero, zero
    mean = values.mean()
    return mean, ((values - mean) ** 2).mean().sqrt()


@ADVANTAGES.register(
    "dr_grpo",
    formula="A_i = r_i - mean_g(r)  [never std-scaled], broadcast to every token",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO, arXiv:2503.20783)",
)
def dr_grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
) -> Tensor:
    """Dr. GRPO advantage: GRPO without the per-group std division.

    A_i = r_i - mean_{j in g(i)} r_j, every token of sequence i gets A_i. ``cfg.scale_by_std`` is
    ignored: removing the std (which up-weights near-uniform groups) is the point of Dr. GRPO.
    (The paper's other fix, dropping the 1/|o_i| length normalisation, is a loss aggregation
    choice and lives in the loss, not here.) A group of one, or with equal rewards, gets 0.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    return _per_token(rewards.to(torch.float64) - mean, mask)


@ADVANTAGES.register(
    "rloo",
    formula="A_i = r_i - (sum_g r - r_i) / (|g| - 1) = |g| / (|g| - 1) * (r_i - mean_g(r)); 0 if |g| = 1",
    paper=(
        "Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning from "
        "Human Feedback in LLMs (arXiv:2402.14740); estimator from Kool et al. 2019"
    ),
)
def rloo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
) -> Tensor:
    """REINFORCE leave-one-out (RLOO) advantage.

    A_i = r_i - (1 / (|g| - 1)) sum_{j in g(i), j != i} r_j = |g| / (|g| - 1) * (r_i - mean_g r):
    each sample's baseline is the mean reward of the *other* samples of its prompt, which keeps
    the gradient estimate unbiased. A group of one has no other sample and gets advantage 0.
    No std scaling (``cfg.scale_by_std`` is ignored). Every token of sequence i gets A_i.
    """
    mean, _, count = group_mean_std(rewards, group_index)
    factor = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    return _per_token(factor * (rewards.to(torch.float64) - mean), mask)


@ADVANTAGES.register(
    "reinforce_pp",
    formula="A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)  [population std over all N sequences]",
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262)",
)
def reinforce_pp_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
) -> Tensor:
    """REINFORCE++ advantage: global batch normalisation of the outcome reward.

    A_i = (r_i - mu) / (sigma + eps), mu and sigma the mean and std of r over all N sequences of
    the batch (groups are ignored). sigma is the *population* std (divide by N, not N - 1): this
    standardises the batch itself, like batch normalisation, so the advantages have exactly zero
    mean and unit variance, and a batch of one is well defined (sigma = 0 -> A = 0), where the
    unbiased estimator would divide by zero. Every sequence counts once, including zero-length
    ones (the paper's implementation normalises over tokens; we weight by sequence, as the
    per-sequence reward is what is normalised). Normalisation is the estimator's definition, so
    ``cfg.scale_by_std`` is ignored; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.
    """
    r = rewards.to(torch.float64)
    mu, sigma = _batch_mean_std(r)
    return _per_token((r - mu) / (sigma + cfg.adv_eps), mask)


@ADVANTAGES.register(
    "reinforce_pp_baseline",
    formula=(
        "d_i = r_i - mean_g(r);  A_i = (d_i - mean_batch(d)) / (std_batch(d) + eps)  "
        "[population std over all N sequences]"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline variant",
)
def reinforce_pp_baseline_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
) -> Tensor:
    """REINFORCE++-baseline advantage: group-mean baseline, then global batch normalisation.

    d_i = r_i - mean_{j in g(i)} r_j, then A_i = (d_i - mu) / (sigma + eps) with mu, sigma the
    mean and population std (divide by N, as in ``reinforce_pp``) of d over all N sequences.
    Since every group's d sums to 0, mu is 0 up to rounding; it is subtracted anyway to follow
    the paper. Unlike GRPO the scale is shared by the whole batch, so a group with a small spread
    is not blown up. Singleton and equal-reward groups have d = 0 and so A = 0 (mu = 0).
    ``cfg.scale_by_std`` is ignored; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    d = rewards.to(torch.float64) - mean
    mu, sigma = _batch_mean_std(d)
    return _per_token((d - mu) / (sigma + cfg.adv_eps), mask)


@ADVANTAGES.register(
    "opo",
    formula="b_g = sum_{j in g} l_j r_j / sum_{j in g} l_j  (l_j = generated tokens of j);  A_i = r_i - b_g",
    paper="Hao et al. 2025, On-Policy RL with Optimal reward baseline (OPO, arXiv:2505.23585)",
)
def opo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, values: Tensor | None, cfg: Any
) -> Tensor:
    """OPO advantage: group baseline weighted by response length (the optimal baseline).

    l_j = number of nonzero entries of ``mask[j]`` (its generated tokens), b_g = sum_{j in g} l_j r_j
    / sum_{j in g} l_j and A_i = r_i - b_g. Under the paper's assumption that token gradients are
    i.i.d., this baseline minimises the variance of the sequence-level policy gradient. A group
    whose lengths are all zero has no baseline and gets 0 (its tokens are all masked anyway). No
    std scaling (``cfg.scale_by_std`` is ignored). Every token of sequence i gets A_i.
    """
    r = rewards.to(torch.float64)
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    length = (mask != 0).sum(dim=-1).to(torch.float64)
    len_sum = r.new_zeros(n_groups).index_add_(0, group_index, length)
    weighted = r.new_zeros(n_groups).index_add_(0, group_index, length * r)
    baseline = (weighted / len_sum.clamp(min=1))[group_index]
    adv = torch.where(len_sum[group_index] > 0, r - baseline, torch.zeros_like(r))
    return _per_token(adv, mask)
