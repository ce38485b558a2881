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
    return adv.to(mask.dtype)[:, None] * mask
