"""Per-role credit for episodes in which one shared policy plays several roles (docs/multi_agent.md).

Two context fields, produced by orchestrate/roles.py from each trajectory's ``metadata["turn_roles"]`` and
``metadata["role_rewards"]`` (orchestrate/multi_turn.py): ``turn_roles`` [N, T] (long: at each model token,
a stable 64-bit key of the role its turn was played as, 0 off the model's turns) and ``role_returns`` [N, T]
(the discounted return of that role from the token's turn on, G^role_{i,k} = sum_{m>=k} gamma^(m-k)
r^role_{i,m}, r^role_{i,m} the role's reward at step m of episode i). A turn of an untrained role has loss
mask 0 and gets no advantage.

    at_grpo    A_{i,t} = (R_{i,k} - mean_S R) / (std_S R + eps),  R_{i,k} = alpha G^team_{i,k} + G^role_{i,k},
               S = the turns of the same prompt, role and turn index k = k(t)          AT-GRPO 2510.11062
    role_ema   A_{i,t} = G^role_{i,k(t)} - b_rho,  b_rho <- beta b_rho + (1 - beta) mean_batch(G^role_rho)
               (b read before this batch is folded in; a role's first batch: its batch mean)
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import (
    ADVANTAGES,
    DiscountSettings,
    GroupNormSettings,
    group_mean_std,
)
from reinforge.algo.context import register_field
from reinforge.algo.returns import _gamma, returns_to_go

ROLES, ROLE_RETURNS = "turn_roles", "role_returns"


def role_key(role: str) -> int:
    """The stable 64-bit key of a role's name (the value of ``turn_roles`` on its turns' tokens): the same in
    every process and run, as ``orchestrate.batch_fields.stable_hash``."""
    return int.from_bytes(hashlib.blake2b(f"role:{role}".encode(), digest_size=8).digest(), "little", signed=True)


register_field(ROLES)  # both produced by orchestrate/roles.py; read here by name
register_field(ROLE_RETURNS)


def turn_steps(live: Tensor, turn_index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model turns (steps) of the live tokens: ``pos`` [N, T] (live tokens of a turn), ``steps`` [S, 2]
    (row, turn index; sorted by row, then turn), ``step_of_token`` (the step of each of ``pos``'s tokens, in
    order) and ``first`` [S] (the index into ``pos``'s tokens of each step's first token)."""
    pos = live & (turn_index >= 0)
    rows = torch.arange(live.shape[0])[:, None].expand(live.shape)[pos]
    key = torch.stack([rows, turn_index[pos].to(torch.int64)], dim=1)
    steps, step_of_token = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((len(steps),), -1, dtype=torch.int64).scatter_reduce(
        0, step_of_token, torch.arange(len(step_of_token)), reduce="amin", include_self=False)
    return pos, steps, step_of_token, first


def _finish(adv: Tensor, mask: Tensor, token_rewards: Tensor | None, cfg: Any) -> Tensor:
    if token_rewards is not None:
        adv = adv + returns_to_go(token_rewards.to(torch.float64), mask, _gamma(cfg))
    return torch.where(mask != 0, adv, 0.0).to(mask.dtype)


def _role_inputs(rewards: Tensor, mask: Tensor, turn_index: Tensor | None, turn_roles: Tensor | None,
                 role_returns: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The fields, or a single-turn, single-role stand-in: turn 0, one role, the reward on every token."""
    if turn_index is None:
        turn_index = torch.where(mask != 0, 0, -1)
    if turn_roles is None:
        turn_roles = torch.zeros(mask.shape, dtype=torch.int64)
    if role_returns is None:
        role_returns = rewards.to(torch.float64)[:, None].expand(mask.shape)
    return turn_index, turn_roles, role_returns.to(torch.float64)


class ATGRPOSettings(GroupNormSettings):
    """AT-GRPO: the weight of the team reward."""

    alpha: float = Field(1.0, ge=0, description="weight of the team return (the episode's step rewards, "
                         "turn_returns) added to the role's own return; the authors' code adds them (1); 0 for "
                         "zero-sum games, whose team reward is 0 anyway")


@ADVANTAGES.register(
    "at_grpo",
    formula="A_{i,t} = (R_{i,k} - mean_S(R)) / (std_S(R) + eps), R_{i,k} = alpha G^team_{i,k} + G^role_{i,k}, "
            "S = the turns of the same prompt, role and turn index k = k(t)  [std scaling optional]",
    paper="Zhao et al. 2025, Stronger Together: On-Policy Reinforcement Learning for Collaborative LLMs "
          "(AT-GRPO, arXiv:2510.11062)",
    needs=("turn_returns", "ungrouped"),  # its groups are not the prompt's: an equal-reward group may carry signal
    settings=ATGRPOSettings,
)
def at_grpo_advantage(
    rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: ATGRPOSettings, turn_returns: Tensor | None = None,
    turn_roles: Tensor | None = None, role_returns: Tensor | None = None, turn_index: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> Tensor:
    """AT-GRPO's agent- and turn-wise grouped advantage.

    Each model turn k of episode i, played as role rho, is one sample with reward R_{i,k} = alpha * G^team_{i,k}
    + G^role_{i,k} (the team return from ``turn_returns``, the role's own from ``role_returns``); samples are
    grouped by (prompt, role, turn index) (the authors' key (env, agent, turn)) and normalised within their
    group as GRPO does (unbiased std; only the mean without ``scale_by_std``); a group of one gets 0. Every
    token of the turn gets its turn's advantage. Without the role fields every turn is one role's and R is
    the reward (single-turn: GRPO). With ``token_rewards`` also their returns-to-go.
    """
    turn_index, turn_roles, role_returns = _role_inputs(rewards, mask, turn_index, turn_roles, role_returns)
    team = role_returns * 0 if turn_returns is None else turn_returns.to(torch.float64)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    pos, steps, step_of_token, first = turn_steps(mask != 0, turn_index)
    if len(steps):
        r = (cfg.alpha * team[pos] + role_returns[pos])[first]
        role = turn_roles[pos].to(torch.int64)[first]
        key = torch.stack([group_index[steps[:, 0]].to(torch.int64), role, steps[:, 1]], dim=1)
        _, group_of_step = torch.unique(key, dim=0, return_inverse=True)
        mean, std, _ = group_mean_std(r, group_of_step)
        adv = r - mean
        if cfg.scale_by_std:
            adv = adv / (std + cfg.adv_eps)
        out[pos] = adv[step_of_token]
    return _finish(out, mask, token_rewards, cfg)


class RoleBaselines:
    """An exponential moving average of each role's episode returns, keyed by the role's key (``turn_roles``);
    the ``role_ema`` estimator's state, saved in checkpoints."""

    def __init__(self, settings: RoleEMASettings) -> None:
        self.settings = settings
        self.value: dict[int, float] = {}
        self.batches: dict[int, int] = {}
        self.last: dict[str, float] = {}

    def baseline(self, role: int, batch_mean: float) -> float:
        """The role's baseline before this batch: its average so far, or this batch's mean for a new role."""
        return self.value.get(role, batch_mean)

    def observe(self, role: int, batch_mean: float) -> None:
        """b <- beta b + (1 - beta) batch_mean (the batch mean itself the first time)."""
        beta = self.settings.decay
        self.value[role] = beta * self.value[role] + (1 - beta) * batch_mean if role in self.value else batch_mean
        self.batches[role] = self.batches.get(role, 0) + 1

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"value": {str(k): v for k, v in self.value.items()},
                "batches": {str(k): v for k, v in self.batches.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = {int(k): float(v) for k, v in state["value"].items()}
        self.batches = {int(k): int(v) for k, v in state["batches"].items()}


class RoleEMASettings(DiscountSettings):
    """The per-role moving-average baseline: its decay."""

    controller: ClassVar[type] = RoleBaselines
    decay: float = Field(0.9, ge=0, lt=1, description="beta of b <- beta b + (1 - beta) mean of the batch's returns "
                         "of the role (0: the batch mean alone)")


def episode_role_returns(role_returns: Tensor, turn_roles: Tensor, pos: Tensor, steps: Tensor,
                         step_of_token: Tensor, first: Tensor) -> tuple[Tensor, Tensor]:
    """Per (row, role) with a live turn: the role and its return from its first live turn in the row."""
    g, role = role_returns[pos][first], turn_roles[pos].to(torch.int64)[first]
    pairs, pair_of_step = torch.unique(torch.stack([steps[:, 0], role], dim=1), dim=0, return_inverse=True)
    first_step = torch.full((len(pairs),), -1, dtype=torch.int64).scatter_reduce(
        0, pair_of_step, torch.arange(len(steps)), reduce="amin", include_self=False)
    return pairs[:, 1], g[first_step]


@ADVANTAGES.register(
    "role_ema",
    formula="A_{i,t} = G^role_{i,k(t)} - b_rho(t), b_rho <- beta b_rho + (1 - beta) mean_batch(G^role_rho) "
            "(read before the update; a role's first batch: its batch mean)",
    paper="Williams 1992, Simple Statistical Gradient-Following Algorithms (REINFORCE's reinforcement baseline, "
          "Machine Learning 8:229-256; no arXiv id), a moving average kept per role",
    needs=("ungrouped",),
    settings=RoleEMASettings,
)
def role_ema_advantage(
    rewards: Tensor, mask: Tensor, cfg: Any, turn_roles: Tensor | None = None, role_returns: Tensor | None = None,
    turn_index: Tensor | None = None, token_rewards: Tensor | None = None,
) -> Tensor:
    """The role's return from the token's turn on minus the role's moving-average baseline.

    ``cfg`` is the run's ``RoleBaselines`` (``ValueError`` with anything else: the baseline is its state).
    The baseline of each role is read before this batch is folded in: the mean over the batch's episodes
    in which the role played a trained turn of the role's return from its first such turn. With
    ``token_rewards`` also their returns-to-go.
    """
    if not isinstance(cfg, RoleBaselines):
        raise ValueError("advantage 'role_ema' needs its RoleBaselines as cfg (the moving averages are its state)")
    turn_index, turn_roles, role_returns = _role_inputs(rewards, mask, turn_index, turn_roles, role_returns)
    out = torch.zeros(mask.shape, dtype=torch.float64)
    pos, steps, step_of_token, first = turn_steps(mask != 0, turn_index)
    if len(steps):
        roles, g = episode_role_returns(role_returns, turn_roles, pos, steps, step_of_token, first)
        token_role = turn_roles[pos].to(torch.int64)
        base = torch.zeros(token_role.shape, dtype=torch.float64)
        for role in roles.unique().tolist():
            batch_mean = float(g[roles == role].mean())
            base[token_role == role] = cfg.baseline(role, batch_mean)
            cfg.observe(role, batch_mean)
        out[pos] = role_returns[pos] - base
        cfg.last = {"role_ema/roles": float(len(cfg.value))}
    return _finish(out, mask, token_rewards, cfg.settings)
