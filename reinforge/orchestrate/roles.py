"""Roles in multi-turn episodes: each role's credit per turn, the batch fields that carry it, its metrics.

A trajectory of an environment with roles (orchestrate/multi_turn.py, docs/multi_agent.md) lists its turns'
roles (``metadata["turn_roles"]``) and each step's reward per role (``metadata["role_rewards"]``). A
trajectory without them is played by one role, ``""``, whose reward at each step is the step's reward.
``role_tensors`` makes the batch fields ``turn_roles`` and ``role_returns`` (algo/role_credit.py reads them;
their producer is orchestrate/batch_fields.py's, run only when a part reads them); the metrics are logged
for every step whose episodes have roles (``reward/role/<role>``, ...).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algo.role_credit import role_key
from reinforge.types import Trajectory

NO_ROLE = ""
__all__ = ["NO_ROLE", "role_key", "role_tensors", "role_metrics", "role_turn_returns", "turn_roles"]


def turn_roles(t: Trajectory) -> list[str]:
    """The role each model turn was played as (``NO_ROLE`` without roles)."""
    roles = t.metadata.get("turn_roles")
    if roles is None:
        return [NO_ROLE] * len(t.turn_spans)
    return [NO_ROLE if r is None else str(r) for r in roles]


def role_rewards(t: Trajectory) -> list[dict[str, float]]:
    """Each step's reward per role (without roles: the step's reward to the one role)."""
    given = t.metadata.get("role_rewards")
    if given is not None:
        return [dict(d) for d in given]
    return [{role: r} for role, r in zip(turn_roles(t), t.turn_rewards, strict=False)]


def role_turn_returns(t: Trajectory, gamma: float) -> list[float]:
    """Per model turn k, played as role rho: sum_{m >= k} gamma^(m - k) r^rho_m, the role's discounted
    return from that turn on (steps m counted over every turn of the episode)."""
    steps, roles = role_rewards(t), turn_roles(t)
    out = []
    for k, role in enumerate(roles):
        out.append(sum(gamma ** (m - k) * steps[m].get(role, 0.0) for m in range(k, len(steps))))
    return out


def episode_returns(t: Trajectory) -> dict[str, float]:
    """Each role's undiscounted return over the episode: the roles that played a turn or got a reward."""
    out = {role: 0.0 for role in turn_roles(t)}
    for step in role_rewards(t):
        for role, r in step.items():
            out[role] = out.get(role, 0.0) + r
    return out


def role_tensors(trajs: list[Trajectory], width: int, gamma: float) -> tuple[Tensor, Tensor]:
    """[N, width] each: at each model token the key of its turn's role (long, 0 off the model's turns) and
    that role's return from the turn on; a trajectory without turns (single-turn) is one turn of ``NO_ROLE``
    with its reward on its generated tokens."""
    keys = torch.zeros((len(trajs), width), dtype=torch.long)
    returns = torch.zeros((len(trajs), width))
    for i, t in enumerate(trajs):
        if not t.turn_spans:
            live = torch.tensor(t.loss_mask, dtype=torch.bool)
            keys[i, : len(t.loss_mask)][live] = role_key(NO_ROLE)
            returns[i, : len(t.loss_mask)][live] = t.reward
            continue
        for (start, end), role, g in zip(t.turn_spans, turn_roles(t), role_turn_returns(t, gamma), strict=True):
            keys[i, start:end], returns[i, start:end] = role_key(role), g
    return keys, returns


def role_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Per role of the episodes with roles: ``reward/role/<role>`` (mean return over the episodes it took
    part in), ``episode/role/<role>/count`` (those episodes), ``episode/role/<role>/turns_mean`` (its model
    turns per episode), ``episode/role/<role>/trained_frac`` (the share of its turns that were trained)
    and, when the environment names a ``winner``, ``episode/role/<role>/win_rate``."""
    with_roles = [t for t in trajs if t.metadata.get("turn_roles") is not None]
    sums: dict[str, list[float]] = {}
    out: dict[str, float] = {}
    for t in with_roles:
        turns = turn_roles(t)
        for role, g in episode_returns(t).items():
            s = sums.setdefault(role, [0.0, 0.0, 0.0, 0.0, 0.0])  # return, episodes, turns, trained turns, wins
            played = [k for k, r in enumerate(turns) if r == role]
            trained = sum(any(t.loss_mask[a:b]) for a, b in (t.turn_spans[k] for k in played))
            s[0], s[1], s[2], s[3] = s[0] + g, s[1] + 1, s[2] + len(played), s[3] + trained
            s[4] += t.metadata.get("winner") == role
    has_winner = any("winner" in t.metadata for t in with_roles)
    for role, (g, n, turns, trained, wins) in sums.items():
        name = role or "none"
        out[f"reward/role/{name}"] = g / n
        out[f"episode/role/{name}/count"] = n
        out[f"episode/role/{name}/turns_mean"] = turns / n
        out[f"episode/role/{name}/trained_frac"] = trained / turns if turns else 0.0
        if has_winner:
            out[f"episode/role/{name}/win_rate"] = wins / n
    return out
