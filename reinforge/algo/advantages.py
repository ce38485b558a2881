"""Advantage estimators: rewards (and values) -> per-token advantages.

An estimator (registered in ``ADVANTAGES``) declares only the parameters it reads: each is a field
of the context record (``algo/context.py``, bound by name by ``Registry.call``), and ``cfg`` is the
estimator's own settings (its ``settings=`` model, validated from ``algo.advantage: {name: ...,
option: value}``). The fields: ``rewards`` [N], ``group_index`` [N] (long: the prompt, i.e. group,
of each sequence), ``mask`` [N, T], ``values`` [N, T] (a critic's; ``gae``), ``token_rewards``
[N, T], ``baseline`` [N] (``remax``), ``turn_returns`` [N, T] (``grpo_turn``). The result is
[N, T] and zero wherever ``mask`` is zero.

``token_rewards`` are extra per-token rewards (e.g. ``-beta * KL`` when the KL penalty is placed in
the reward); only masked positions count. The outcome estimators (grpo, dr_grpo, rloo,
reinforce_pp_baseline, opo, remax) add to every masked token t its discounted return-to-go
``sum_{s >= t, m_s = 1} gamma^(k(s) - k(t)) tr_s`` (k counts masked tokens, so unmasked positions,
e.g. environment tokens between the model turns of a multi-turn episode, are skipped, not
discounted; ``gamma = cfg.gamma``); ``reinforce_pp`` and ``gae`` instead fold them into the per-token
return they normalise / bootstrap. ``baseline`` is a per-sequence baseline reward (the reward of the
greedy completion of the sequence's prompt), used by ``remax`` only.

All estimators compute in float64 and return ``mask.dtype``; without ``token_rewards`` the outcome
estimators give exactly the per-sequence advantage broadcast over the masked tokens.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.context import PART_INPUTS
from reinforge.algo.returns import (  # noqa: F401  (re-exported: the estimators' shared helpers)
    _gamma,
    _per_token,
    gae_advantages_and_returns,
    last_token_onehot,
    outcome_token_rewards,
    returns_to_go,
    turn_returns,
)
from reinforge.registry import Registry, Settings, kind


class AdvantageFn(Protocol):
    """An estimator: keyword parameters named after the context fields it reads, ``cfg`` its
    settings; returns the [N, T] advantages (e.g. ``fn(rewards, group_index, mask, cfg)``)."""

    def __call__(self, **fields: Any) -> Tensor: ...


ADVANTAGES: Registry[AdvantageFn] = kind(
    "advantage", Registry("advantage estimator", inputs=PART_INPUTS, references=True))


class DiscountSettings(Settings):
    """The discount of per-token rewards, the one option every built-in estimator reads."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount of per-token rewards (returns-to-go, GAE, "
                         "multi-turn turn returns)")


class NormSettings(DiscountSettings):
    """Estimators that divide by a standard deviation (REINFORCE++)."""

    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the std in the denominator")


class GroupNormSettings(NormSettings):
    """GRPO-like estimators, whose std scaling is optional."""

    scale_by_std: bool = Field(True, description="divide by the std (grpo: the group's; gae: whiten over the batch)")


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
    settings=GroupNormSettings,
)
def grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: GroupNormSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """Group-relative advantage (GRPO, outcome supervision).

    A_i = (r_i - mean_{j in g(i)} r_j) / (std_{j in g(i)} r_j + eps), with the unbiased std;
    without ``cfg.scale_by_std`` only the mean is subtracted. Every token of sequence i gets A_i.
    A group of one sample, or one whose rewards are all equal, gets advantage 0.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, std, _ = group_mean_std(rewards, group_index)
    adv = rewards.to(torch.float64) - mean
    if cfg.scale_by_std:
        adv = adv / (std + cfg.adv_eps)
    return _per_token(adv, mask, token_rewards, cfg)


@ADVANTAGES.register(
    "grpo_turn",
    formula="A_{i,t} = (G_{i,k(t)} - mean_g(G_{.,0})) / (std_g(G_{.,0}) + eps), G_{i,k} = sum_{m>=k} gamma^(m-k) r_{i,m}, "
            "k(t) = the turn of token t  [std scaling optional]",
    paper="turn-level credit for multi-turn agents, cf. Zeng et al. 2025 (arXiv:2505.11821); group baseline of "
          "Shao et al. 2024 (arXiv:2402.03300)",
    needs=("turn_returns",),
    settings=GroupNormSettings,
)
def grpo_turn_advantage(
    rewards: Tensor,
    group_index: Tensor,
    mask: Tensor,
    cfg: GroupNormSettings,
    token_rewards: Tensor | None = None,
    turn_returns: Tensor | None = None,  # noqa: F811  (the context field; the function of that name is returns.py's)
) -> Tensor:
    """Turn-level group-relative advantage for multi-turn episodes.

    Every model token t of episode i gets the discounted return from its own turn on, G_{i,k(t)}
    (``turn_returns[i, t]``, filled by the orchestrator from ``Trajectory.turn_rewards`` with
    ``cfg.gamma``), minus the mean over the group (episodes of the same task) of the episodes'
    returns from the start G_{j,0}, divided by their std (``cfg.scale_by_std``). A later turn is
    credited only with the rewards that came after it; with one turn (or gamma = 1 and a reward
    at the end only) this is ``grpo``. Without ``turn_returns`` every token gets r_i (single-turn).
    """
    if turn_returns is None:
        turn_returns = rewards.to(torch.float64)[:, None].expand(mask.shape)
    turn_returns = turn_returns.to(torch.float64)
    live = mask != 0
    has_tokens = live.any(1)
    first = live.to(torch.int64).argmax(1)
    g0 = torch.where(has_tokens, turn_returns.gather(1, first[:, None])[:, 0], rewards.to(torch.float64))
    mean, std, _ = group_mean_std(g0, group_index)
    adv = turn_returns - mean[:, None]
    if cfg.scale_by_std:
        adv = adv / (std[:, None] + cfg.adv_eps)
    if token_rewards is not None:
        adv = adv + returns_to_go(token_rewards.to(torch.float64), mask, _gamma(cfg))
    return (adv * live).to(mask.dtype)


@ADVANTAGES.register(
    "dr_grpo",
    formula="A_i = r_i - mean_g(r)  [never std-scaled], broadcast to every token",
    paper="Liu et al. 2025, Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO, arXiv:2503.20783)",
    settings=DiscountSettings,
)
def dr_grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """Dr. GRPO advantage: GRPO without the per-group std division.

    A_i = r_i - mean_{j in g(i)} r_j, every token of sequence i gets A_i. It has no ``scale_by_std``
    option: removing the std (which up-weights near-uniform groups) is the point of Dr. GRPO.
    (The paper's other fix, dropping the 1/|o_i| length normalisation, is a loss aggregation
    choice and lives in the loss, not here.) A group of one, or with equal rewards, gets 0.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    return _per_token(rewards.to(torch.float64) - mean, mask, token_rewards, cfg)


@ADVANTAGES.register(
    "rloo",
    formula="A_i = r_i - (sum_g r - r_i) / (|g| - 1) = |g| / (|g| - 1) * (r_i - mean_g(r)); 0 if |g| = 1",
    paper=(
        "Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning from "
        "Human Feedback in LLMs (arXiv:2402.14740); estimator from Kool et al. 2019"
    ),
    settings=DiscountSettings,
)
def rloo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE leave-one-out (RLOO) advantage.

    A_i = r_i - (1 / (|g| - 1)) sum_{j in g(i), j != i} r_j = |g| / (|g| - 1) * (r_i - mean_g r):
    each sample's baseline is the mean reward of the *other* samples of its prompt, which keeps
    the gradient estimate unbiased. A group of one has no other sample and gets advantage 0.
    No std scaling. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, count = group_mean_std(rewards, group_index)
    factor = torch.where(count > 1, count / (count - 1).clamp(min=1), torch.zeros_like(count))
    return _per_token(factor * (rewards.to(torch.float64) - mean), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "opo",
    formula="b_g = sum_{j in g} l_j r_j / sum_{j in g} l_j  (l_j = generated tokens of j);  A_i = r_i - b_g",
    paper="Hao et al. 2025, On-Policy RL with Optimal reward baseline (OPO, arXiv:2505.23585)",
    settings=DiscountSettings,
)
def opo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """OPO advantage: group baseline weighted by response length (the optimal baseline).

    l_j = number of nonzero entries of ``mask[j]`` (its generated tokens), b_g = sum_{j in g} l_j r_j
    / sum_{j in g} l_j and A_i = r_i - b_g. Under the paper's assumption that token gradients are
    i.i.d., this baseline minimises the variance of the sequence-level policy gradient. A group
    whose lengths are all zero has no baseline and gets 0 (its tokens are all masked anyway). No
    std scaling. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    r = rewards.to(torch.float64)
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    length = (mask != 0).sum(dim=-1).to(torch.float64)
    len_sum = r.new_zeros(n_groups).index_add_(0, group_index, length)
    weighted = r.new_zeros(n_groups).index_add_(0, group_index, length * r)
    b_g = (weighted / len_sum.clamp(min=1))[group_index]
    adv = torch.where(len_sum[group_index] > 0, r - b_g, torch.zeros_like(r))
    return _per_token(adv, mask, token_rewards, cfg)


