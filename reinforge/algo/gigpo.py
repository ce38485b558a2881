"""GiGPO: group-in-group advantages for multi-turn agents (Feng et al. 2025, arXiv:2505.10978).

Two levels of group-relative advantage, added:

    A^E_i = (R_i - mean_g(R)) / F(g)                       episode level: the episodes of one task
    A^S_{i,k} = (G_{i,k} - mean_{S(i,k)}(G)) / F(S(i,k))   step level: every model turn k of every
                                                           episode of the task that acted from the
                                                           same anchor state as turn k of episode i
    A_{i,t} = A^E_i + omega * A^S_{i,k(t)}

R_i is the episode's reward (the sum of its turn rewards), G_{i,k} = sum_{m>=k} gamma^(m-k) r_{i,m}
the discounted return from turn k on (``turn_returns``), F the std of the group (``scale_by_std``,
the paper's default) or 1. A step group of one turn has A^S = 0. The anchor state of a turn is the
environment state it acted from (``turn_states``: a hash of the environment's ``state_key()`` or,
without one, of the observation text; orchestrate/multi_turn.py); turns are told apart by
``turn_index``. Step groups never cross tasks: a state is keyed by (group, state).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, GroupNormSettings, group_mean_std, group_relative
from reinforge.algo.returns import _gamma, returns_to_go


class StepGroupStats:
    """The step groups of the last batch, reported after the update (``gigpo/*`` metrics); no state."""

    def __init__(self, settings: GiGPOSettings) -> None:
        self.settings = settings
        self.last: dict[str, float] = {}

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class GiGPOSettings(GroupNormSettings):
    """GiGPO: the weight of the step level and the discount of the step returns."""

    controller: ClassVar[type] = StepGroupStats
    omega: float = Field(1.0, ge=0, description="weight of the step-level advantage A^S (the paper: 1)")
    gamma: float = Field(0.95, ge=0, le=1, description="discount of the step returns G_k = sum_m gamma^(m-k) r_m "
                         "(the paper: 0.95)")


def step_advantages(turn_returns: Tensor, turn_states: Tensor, turn_index: Tensor, group_index: Tensor,
                    live: Tensor, scale_by_std: bool, eps: float) -> tuple[Tensor, dict[str, float]]:
    """A^S at every live token ([N, T] float64) and the step groups' statistics.

    A step is one (row, turn); its return and state are those of its tokens. Steps are grouped by
    (the row's group, the state); each step gets (G - mean) / (std + eps) over its step group
    (unbiased std; only the mean without ``scale_by_std``), 0 in a group of one."""
    out = torch.zeros(live.shape, dtype=torch.float64)
    pos = live & (turn_index >= 0)
    if not pos.any():
        return out, {"gigpo/steps": 0.0, "gigpo/step_groups": 0.0, "gigpo/steps_grouped": 0.0}
    rows = torch.arange(live.shape[0])[:, None].expand(live.shape)[pos]
    step_key = torch.stack([rows, turn_index[pos].to(torch.int64)], dim=1)
    steps, step_of_token = torch.unique(step_key, dim=0, return_inverse=True)
    first = torch.full((len(steps),), -1, dtype=torch.int64).scatter_reduce(
        0, step_of_token, torch.arange(len(step_of_token)), reduce="amin", include_self=False)
    g = turn_returns[pos].to(torch.float64)[first]
    state = turn_states[pos].to(torch.int64)[first]
    group_key = torch.stack([group_index[steps[:, 0]].to(torch.int64), state], dim=1)
    groups, group_of_step = torch.unique(group_key, dim=0, return_inverse=True)
    mean, std, count = group_mean_std(g, group_of_step)
    adv = g - mean
    if scale_by_std:
        adv = adv / (std + eps)
    out[pos] = adv[step_of_token]
    stats = {"gigpo/steps": float(len(steps)), "gigpo/step_groups": float(len(groups)),
             "gigpo/steps_grouped": float((count > 1).to(torch.float64).mean())}
    return out, stats


@ADVANTAGES.register(
    "gigpo",
    formula="A_{i,t} = (R_i - mean_g(R)) / std_g(R) + omega * (G_{i,k} - mean_S(G)) / std_S(G), k = turn of t, "
            "S = the turns of group g from the same anchor state as (i, k)  [std scaling optional]",
    paper="Feng et al. 2025, Group-in-Group Policy Optimization for LLM Agent Training (GiGPO, arXiv:2505.10978)",
    needs=("turn_returns", "turn_states"),
    settings=GiGPOSettings,
)
def gigpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: Any, turn_returns: Tensor | None = None,
    turn_states: Tensor | None = None, turn_index: Tensor | None = None, token_rewards: Tensor | None = None,
) -> Tensor:
    """GiGPO's advantage: the episode-level group advantage plus omega times the step-level one.

    ``cfg`` is the run's ``StepGroupStats`` (``cfg.settings`` the options) or the settings. Without
    ``turn_states`` (no recorded states) the step level is 0 and this is ``grpo``. With
    ``token_rewards``, every masked token t also gets ``returns_to_go(token_rewards)[t]``.
    """
    s = getattr(cfg, "settings", cfg)
    live = mask != 0
    episode = group_relative(rewards.to(torch.float64), group_index, s)
    adv = episode[:, None].expand(mask.shape).clone()
    if turn_states is not None and turn_index is not None and turn_returns is not None:
        step, stats = step_advantages(turn_returns, turn_states, turn_index, group_index, live, s.scale_by_std,
                                      s.adv_eps)
        adv = adv + s.omega * step
        if isinstance(cfg, StepGroupStats):
            cfg.last = stats
    if token_rewards is not None:
        adv = adv + returns_to_go(token_rewards.to(torch.float64), mask, _gamma(s))
    return torch.where(live, adv, 0.0).to(mask.dtype)
