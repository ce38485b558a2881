"""IGPO: information-gain turn rewards for multi-turn agents (Wang et al. 2025, "Information Gain-based
Policy Optimization: A Simple and Effective Approach for Multi-Turn LLM Agents", arXiv:2510.14967).

Each turn is rewarded by how much it raised the policy's belief in the ground-truth answer a: with
p_k = pi(a | q, history before turn k) = exp(mean_j log pi(a_j | q, history before turn k, a_<j))
(teacher-forced, the geometric mean over the answer's tokens), turn k of an episode of K turns gets

    r_k = p_{k+1} - p_k          for k < K - 1   (the information gain of turn k and its observation)
    r_{K-1} = R                  the outcome reward of the episode at its last turn

then every turn reward of the group's episodes is normalised together (one mean and std per group
over all its turns; ``normalize: separate`` normalises the gains and the outcomes apart, the authors'
later option), and each turn's advantage is the discounted sum of the normalised rewards from it on,
given to every token of the turn:

    r~_{i,k} = (r_{i,k} - mean_g(r)) / (std_g(r) + eps),   A_{i,k} = sum_{m>=k} gamma^(m-k) r~_{i,m}

The probabilities come from the loop: the need ``answer_probs`` (orchestrate/answer_probs.py) scores
the gold answer after the history before every turn with the current policy and writes p_k on the
tokens of turn k (the context field ``answer_probs`` [N, T]). Choices, from the authors' code
(github.com/GuoqingWang1/IGPO, its later core_algos.py): gamma = 1; the std is the population std,
1 in a group of one turn; the last turn's reward is the outcome even when the episode was cut by a
limit. Departure: the authors' code leaves turn rewards that are exactly 0 out of the group
statistics (its mask is ``reward != 0``); here every turn counts, as the paper states it. The episode
reward ``R`` replaces the paper's answer F1 (the run's reward is whatever the environment scores).
A single-turn row (no turns) has one turn: its advantage is the group-normalised R (GRPO).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, GroupNormSettings
from reinforge.algo.context import register_field

FIELD = "answer_probs"
register_field(FIELD)  # produced by orchestrate/answer_probs.py; read here by name


class IGPOSettings(GroupNormSettings):
    """IGPO: the discount over turns, how the turn rewards are normalised, and how the gold answer is written."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount of the normalised turn rewards over turns (the "
                         "authors' runs: 1)")
    normalize: Literal["joint", "separate"] = Field(
        "joint", description="joint: one group mean / std over all turn rewards (the paper's); separate: the "
        "information gains and the outcome rewards each over their own")
    answer_template: str = Field("{answer}", description="the text the model would write as its answer turn, "
                                 "{answer} the task's gold answer; only the answer's tokens are scored")


def turn_table(values: Tensor, turn_index: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
    """([N, K] float64, [N, K] bool): the value each row's turn k holds on its tokens, and which turns
    the row has (K = 1 + the largest turn index)."""
    pos = live & (turn_index >= 0)
    k = int(turn_index[pos].max().item()) + 1 if pos.any() else 1
    table = torch.zeros((live.shape[0], k), dtype=torch.float64)
    present = torch.zeros((live.shape[0], k), dtype=torch.bool)
    rows = torch.arange(live.shape[0])[:, None].expand(live.shape)[pos]
    cols = turn_index[pos].to(torch.int64)
    table[rows, cols] = values[pos].to(torch.float64)
    present[rows, cols] = True
    return table, present


def igpo_turn_rewards(probs: Tensor, present: Tensor, rewards: Tensor) -> tuple[Tensor, Tensor]:
    """(r [N, K], is_last [N, K]): r_k = p_{k+1} - p_k before the last turn, R at it, 0 where no turn."""
    k = probs.shape[1]
    last = torch.where(present, torch.arange(k), -1).max(dim=1).values
    is_last = torch.arange(k)[None, :] == last[:, None]
    gain = torch.cat([probs[:, 1:], probs.new_zeros((probs.shape[0], 1))], dim=1) - probs
    r = torch.where(is_last, rewards.to(torch.float64)[:, None], gain)
    return torch.where(present, r, 0.0), is_last & present


def normalize_turns(r: Tensor, which: Tensor, group_index: Tensor, scale_by_std: bool, eps: float) -> Tensor:
    """(r - mean) / (std + eps) over the entries ``which`` [N, K] of each group (population std; a group of one
    entry has std 1); other entries unchanged."""
    groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    g = group_index.to(torch.int64)[:, None].expand(r.shape)[which]
    x = r[which]
    count = torch.zeros(groups, dtype=torch.float64).index_add_(0, g, torch.ones_like(x))
    mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, g, x) / count.clamp(min=1)
    var = torch.zeros(groups, dtype=torch.float64).index_add_(0, g, (x - mean[g]) ** 2) / count.clamp(min=1)
    std = torch.where(count > 1, var.sqrt(), 1.0)
    out = r.clone()
    out[which] = (x - mean[g]) / (std[g] + eps) if scale_by_std else x - mean[g]
    return out


def discounted_turn_sums(r: Tensor, gamma: float) -> Tensor:
    """[N, K]: sum_{m >= k} gamma^(m-k) r[:, m], one matrix product (D[k, m] = gamma^(m-k) for m >= k)."""
    k = torch.arange(r.shape[1], dtype=torch.float64)
    gap = k[None, :] - k[:, None]
    d = torch.where(gap >= 0, torch.tensor(gamma, dtype=torch.float64) ** gap.clamp(min=0), 0.0)
    return r @ d.T


@ADVANTAGES.register(
    "igpo",
    formula="r_k = p_{k+1} - p_k (k < K-1), r_{K-1} = R, p_k = exp(mean_j log pi(a_j; q, o_<k, a_<j)); "
            "A_{i,k} = sum_{m>=k} gamma^(m-k) (r_{i,m} - mean_g(r)) / std_g(r), mean / std over all turns of group g",
    paper="Wang et al. 2025, Information Gain-based Policy Optimization (IGPO, arXiv:2510.14967)",
    needs=(FIELD,),
    settings=IGPOSettings,
)
def igpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: IGPOSettings,
                   answer_probs: Tensor | None = None, turn_index: Tensor | None = None) -> Tensor:
    """IGPO's turn advantage (module docstring) on every token of each turn; without ``answer_probs`` /
    ``turn_index`` every row is one turn (the group-normalised outcome)."""
    live = mask != 0
    if turn_index is None:
        turn_index = torch.where(live, 0, -1)
    if answer_probs is None:
        answer_probs = torch.zeros(mask.shape, dtype=torch.float64)
    probs, present = turn_table(answer_probs, turn_index, live)
    r, is_last = igpo_turn_rewards(probs, present, rewards)
    if cfg.normalize == "joint":
        r = normalize_turns(r, present, group_index, cfg.scale_by_std, cfg.adv_eps)
    else:
        r = normalize_turns(r, present & ~is_last, group_index, cfg.scale_by_std, cfg.adv_eps)
        r = normalize_turns(r, is_last, group_index, cfg.scale_by_std, cfg.adv_eps)
    adv = discounted_turn_sums(torch.where(present, r, 0.0), cfg.gamma)
    pos = live & (turn_index >= 0)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    out[pos] = adv[torch.arange(mask.shape[0])[:, None].expand(mask.shape)[pos], turn_index[pos].to(torch.int64)]
    return out.to(mask.dtype)
