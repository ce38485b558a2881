"""Lite PPO's advantage: the group's mean as the baseline, the batch's standard deviation as the scale.

    A_i = (r_i - mean_g(r)) / (std_batch(r) + eps)

Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning" (arXiv:2508.08221),
GRPO's group-level normalisation divides by each group's own spread, which blows up a group
whose rewards are nearly equal (a homogeneous, "easy" or "hard", prompt); the batch-level scale is shared
by every group, so such a group keeps a small advantage while the group-level mean still gives each prompt
its own baseline. Lite PPO is this advantage with PPO's clipped surrogate (``ppo_clip``, no critic) and
token-level loss aggregation (``loss_agg: token_mean``, each token of the mini-batch weighted alike).

Which standard deviation: the paper names it the batch-level standard deviation of the rewards, read here
as the std of the batch's rewards (``std_of: rewards``, the default; the paper's method section itself could
not be read, only its abstract and summaries of it); the paper's framework (ROLL, ``group_reward_norm``
with ``div_std_global``) takes it over the group-centred rewards ``d_i = r_i - mean_g(r)``
(``std_of: centred``). The two differ by the spread between the groups' means: the raw rewards' variance
is the centred rewards' plus the variance of the group means, so ``rewards`` gives the smaller advantages
when prompts differ in difficulty.
``reinforce_pp_baseline`` is the centred form with the population std and a batch re-centring
(``(d - mean_batch(d)) / (std_batch(d) + eps)``); both standard deviations here are the unbiased
(divide by N - 1) one, ``torch.std``'s, as ROLL computes it.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, NormSettings, group_mean_std
from reinforge.algo.returns import _per_token


class LitePPOSettings(NormSettings):
    """Lite PPO's batch scale: of which values the batch's standard deviation is taken."""

    std_of: Literal["rewards", "centred"] = Field(
        "rewards", description="the batch std of the raw rewards (our reading of the paper) or of the group-centred "
        "rewards r - mean_g(r) (the paper's code, ROLL's div_std_global)")


def batch_std(values: Tensor) -> Tensor:
    """The unbiased (divide by N - 1) standard deviation of a 1-D float64 tensor; 0 with fewer than 2 values."""
    if values.numel() < 2:
        return values.new_zeros(())
    return values.std(correction=1)


@ADVANTAGES.register(
    "lite_ppo",
    formula="A_i = (r_i - mean_g(r)) / (std_batch(x) + eps), x = r (std_of: rewards) or r - mean_g(r) "
            "(std_of: centred), unbiased std over all N sequences, broadcast to every token",
    paper="Liu et al. 2025, Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning (Lite PPO) "
          "(arXiv:2508.08221)",
    settings=LitePPOSettings,
)
def lite_ppo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: LitePPOSettings,
                       token_rewards: Tensor | None = None) -> Tensor:
    """Group-level mean, batch-level std: A_i = (r_i - mean_{j in g(i)} r_j) / (sigma + eps), sigma the
    unbiased std over all N sequences of the raw rewards (``std_of: rewards``) or of the group-centred
    rewards (``std_of: centred``). A group whose rewards are all equal gets 0; a batch whose rewards are
    all equal gets 0 everywhere (sigma = 0, numerator 0). Every token of sequence i gets A_i; with
    ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``."""
    r = rewards.to(torch.float64)
    mean, _, _ = group_mean_std(r, group_index)
    centred = r - mean
    sigma = batch_std(r if cfg.std_of == "rewards" else centred)
    return _per_token(centred / (sigma + cfg.adv_eps), mask, token_rewards, cfg)
