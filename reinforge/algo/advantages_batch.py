"""Advantage estimators over the whole batch or with a baseline from outside the group: REINFORCE++
(batch normalisation), REINFORCE++-baseline, ReMax (a greedy completion's reward) and GAE (a critic).
Parameters and conventions: algo/advantages.py."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantages import (
    ADVANTAGES,
    DiscountSettings,
    GroupNormSettings,
    NormSettings,
    group_mean_std,
)
from reinforge.algo.returns import (
    _batch_mean_std,
    _gamma,
    _masked_whiten,
    _per_token,
    gae_advantages_and_returns,
    outcome_token_rewards,
    returns_to_go,
)


class GAESettings(GroupNormSettings):
    """GAE: the discount, lambda and the optional whitening of the advantages."""

    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")


class ReinforcePPSettings(NormSettings):
    """REINFORCE++: how the batch whitening weighs tokens."""

    whiten: Literal["token", "sequence"] = Field(
        "token", description="token: every masked token weighs the same in the batch mean/std (the paper); "
        "sequence: every sequence weighs the same (token weight 1/|y_i|)")


@ADVANTAGES.register(
    "reinforce_pp",
    formula=(
        "G_t = sum_{s>=t} gamma^(s-t) (tr_s + r_i [s = last])  [tr = 0 without token rewards]; "
        "A_t = (G_t - mean_w(G)) / (std_w(G) + eps) over the batch's masked tokens, "
        "w_t = 1 (whiten: token) or 1/|y_i| (whiten: sequence)"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262)",
    settings=ReinforcePPSettings,
)
def reinforce_pp_advantage(
    rewards: Tensor, mask: Tensor, cfg: ReinforcePPSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE++ advantage: the per-token return, whitened over the whole batch (groups ignored).

    The outcome reward r_i sits on the last masked token of sequence i, plus the per-token rewards
    ``tr`` when there are any (e.g. -beta * KL with the KL in the reward); G_t is the discounted
    return-to-go over the masked tokens. G is whitened over every masked token of the batch:
    A_t = (G_t - mu) / (sigma + eps), mu and sigma the weighted mean and *population* std
    (divide by the total weight, so a batch of one or an all-equal batch gives A = 0).

    The weights are the same with and without token rewards, so turning the KL off does not change
    how long responses count: ``whiten: token`` (default, the paper's per-token normalisation:
    w_t = 1, a long response weighs more) or ``whiten: sequence`` (w_t = 1/|y_i|: every response
    weighs the same; with gamma = 1 and no token rewards this is the per-sequence normalisation of
    r_i). Zero-length responses have no tokens and do not count. ``eps = cfg.adv_eps``.
    """
    tr = token_rewards if token_rewards is not None else torch.zeros_like(mask)
    g = returns_to_go(outcome_token_rewards(rewards, mask, tr), mask, _gamma(cfg)).to(torch.float64)
    live = mask != 0
    weight = live.to(torch.float64)
    if getattr(cfg, "whiten", "token") == "sequence":
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1)
    total = weight.sum()
    if total == 0:
        return torch.zeros_like(mask)
    mu = (weight * g).sum() / total
    sigma = ((weight * (g - mu) ** 2).sum() / total).sqrt()
    return torch.where(live, (g - mu) / (sigma + cfg.adv_eps), 0.0).to(mask.dtype)


@ADVANTAGES.register(
    "reinforce_pp_baseline",
    formula=(
        "d_i = r_i - mean_g(r);  A_i = (d_i - mean_batch(d)) / (std_batch(d) + eps)  "
        "[population std over all N sequences]"
    ),
    paper="Hu 2025, REINFORCE++ (arXiv:2501.03262), REINFORCE++-baseline variant",
    settings=NormSettings,
)
def reinforce_pp_baseline_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: NormSettings, token_rewards: Tensor | None = None
) -> Tensor:
    """REINFORCE++-baseline advantage: group-mean baseline, then global batch normalisation.

    d_i = r_i - mean_{j in g(i)} r_j, then A_i = (d_i - mu) / (sigma + eps) with mu, sigma the
    mean and population std (divide by N, as in ``reinforce_pp``) of d over all N sequences.
    Since every group's d sums to 0, mu is 0 up to rounding; it is subtracted anyway to follow
    the paper. Unlike GRPO the scale is shared by the whole batch, so a group with a small spread
    is not blown up. Singleton and equal-reward groups have d = 0 and so A = 0 (mu = 0).
    There is no ``scale_by_std`` option; ``eps = cfg.adv_eps``. Every token of sequence i gets A_i.
    With ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    mean, _, _ = group_mean_std(rewards, group_index)
    d = rewards.to(torch.float64) - mean
    mu, sigma = _batch_mean_std(d)
    return _per_token((d - mu) / (sigma + cfg.adv_eps), mask, token_rewards, cfg)


@ADVANTAGES.register(
    "remax",
    formula="A_i = r_i - r(greedy completion of prompt(i)), broadcast to every token (+ token-reward returns-to-go)",
    paper="Li et al. 2023, ReMax: A Simple, Effective, and Efficient RL Method for Aligning LLMs (arXiv:2310.10505)",
    needs=("baseline",),
    settings=DiscountSettings,
)
def remax_advantage(
    rewards: Tensor, mask: Tensor, cfg: DiscountSettings, token_rewards: Tensor | None = None,
    baseline: Tensor | None = None,
) -> Tensor:
    """ReMax advantage: REINFORCE with the greedy completion's reward as baseline.

    A_i = r_i - b_i with b_i = ``baseline[i]``, the reward of the greedy (argmax-decoded) completion
    of sequence i's prompt; the baseline removes the prompt's difficulty from the return without
    a critic. No normalisation; groups are not used. Every token
    of sequence i gets A_i. With ``token_rewards``, every masked token t also gets
    ``returns_to_go(token_rewards)[t]``. Raises ``ValueError`` without ``baseline``.
    """
    if baseline is None:
        raise ValueError(
            "advantage 'remax' needs baseline= (the reward of each prompt's greedy completion, shape [N])"
        )
    if baseline.shape != rewards.shape:
        raise ValueError(f"remax baseline has shape {tuple(baseline.shape)}, expected {tuple(rewards.shape)}")
    adv = rewards.to(torch.float64) - baseline.to(torch.float64)
    return _per_token(adv, mask, token_rewards, cfg)


@ADVANTAGES.register(
    "gae",
    formula=(
        "delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1} over masked tokens, "
        "r_t = tr_t + r_i [t = last]; whitened over the batch's masked tokens if scale_by_std"
    ),
    paper="Schulman et al. 2016, High-Dimensional Continuous Control Using GAE (arXiv:1506.02438)",
    needs=("values",),
    settings=GAESettings,
)
def gae_advantage(
    rewards: Tensor, mask: Tensor, values: Tensor | None, cfg: GAESettings, token_rewards: Tensor | None = None
) -> Tensor:
    """GAE advantage with a critic (PPO with a value model).

    The per-token reward is r_t = tr_t (``token_rewards``, 0 if absent) plus the outcome reward r_i
    on the last masked token of row i; A = ``gae_advantages_and_returns(r, values, mask, cfg.gamma,
    cfg.lam)[0]``. With ``cfg.scale_by_std`` the advantages are whitened over all masked tokens of
    the batch: A_t <- (A_t - mean) / (std + cfg.adv_eps) (population std). Groups are not used.
    Requires ``values`` (``ValueError`` without). The returns for the value loss are obtained by
    calling ``gae_advantages_and_returns`` directly.
    """
    if values is None:
        raise ValueError("advantage 'gae' needs values= (critic values per token, shape [N, T])")
    r = outcome_token_rewards(rewards, mask, token_rewards)
    adv, _ = gae_advantages_and_returns(r, values.detach().to(torch.float64), mask, float(cfg.gamma), float(cfg.lam))
    if cfg.scale_by_std:
        adv = _masked_whiten(adv, mask, cfg.adv_eps)
    return (adv * (mask != 0)).to(mask.dtype)
