"""Pay-per-search: a correct answer is worth less the more tool calls it took (registered in
``REWARD_SHAPERS``), MASH's reward (Gul, Cardie & Goyal 2025, Pay-Per-Search Models are Abstention
Models, arXiv:2510.01152), checked against the authors' code (momergul/mash,
``verl_training/rule_based_rewards``).

With n_i the tool calls of rollout i (``Trajectory.metadata['tool_calls']``, counted by the tool
environments) and m the fewest calls among its group's rollouts with a positive reward, a rollout with
r_i > 0 gets r_i * p(n_i, m); others keep their reward. The penalties MASH trains with:

- ``exp``: p = lambda^(n - m) (MASH's default; lambda 0.5 on NQ, 0.8 on the multi-hop sets);
- ``otc``: OTC-GRPO's (Wang et al. 2025, arXiv:2504.14870) f = 0 if n = m = 0, n if m = 0, else
  2nm / (n + m); p = 1 if f = 0, cos(n pi / (2n + C)) if m = 0 (C: the call limit), else sin(f pi / (2m));
- ``otc_strict``: ``otc``, and when m = 0 a correct rollout that called a tool gets 0.

Departure: the authors' code keeps, per question, the fewest calls seen over the whole run and uses
min(group minimum, that) as m; shapers here see one batch, so m is the group's minimum.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.groups import dense_groups, group_reduce
from reinforge.algo.shaping import REWARD_SHAPERS, Shaping
from reinforge.registry import Settings

MASH = "Gul, Cardie & Goyal 2025, Pay-Per-Search Models are Abstention Models (MASH, arXiv:2510.01152)"


class SearchCostSettings(Settings):
    penalty: Literal["exp", "otc", "otc_strict"] = Field("exp", description="the penalty p(n, m): MASH's "
                                                         "exponential, or OTC-GRPO's (plain or strict)")
    decay: float = Field(0.8, gt=0, le=1, description="lambda of the exp penalty, lambda^(n - m)")
    max_calls: int = Field(3, ge=1, description="C, the call limit in OTC's cos(n pi / (2n + C)) (the "
                                                "environment's max_tool_calls)")


def fewest_calls(calls: Tensor, rewarded: Tensor, group_index: Tensor) -> Tensor:
    """[N] float64: per row, the fewest calls among its group's rows with a positive reward (inf if none)."""
    gid, n_groups = dense_groups(group_index)
    counted = torch.where(rewarded, calls.to(torch.float64), torch.full_like(calls, math.inf, dtype=torch.float64))
    return group_reduce(counted, gid, n_groups, "amin")


def exp_penalty(n: Tensor, m: Tensor, decay: float) -> Tensor:
    """lambda^(n - m)."""
    return torch.pow(torch.full_like(n, decay), n - m)


def otc_penalty(n: Tensor, m: Tensor, max_calls: int) -> Tensor:
    """OTC-GRPO's p(n, m): with f = 0 (n = m = 0), n (m = 0), 2nm / (n + m) (else), p = 1 if f = 0,
    cos(n pi / (2n + C)) if m = 0, sin(f pi / (2m)) otherwise. n, m float64; m finite."""
    f = torch.where(m == 0, n, 2 * n * m / (n + m).clamp(min=1e-12))
    from_none = torch.cos(n * math.pi / (2 * n + max_calls))
    from_some = torch.sin(f * math.pi / (2 * m.clamp(min=1e-12)))
    p = torch.where(m == 0, from_none, from_some)
    return torch.where(f == 0, torch.ones_like(p), p)


def _otc_strict(n: Tensor, m: Tensor, cfg: SearchCostSettings) -> Tensor:
    p = otc_penalty(n, m, cfg.max_calls)
    return torch.where((m == 0) & (n > 0), torch.zeros_like(p), p)


_PENALTIES = {
    "exp": lambda n, m, cfg: exp_penalty(n, m, cfg.decay),
    "otc": lambda n, m, cfg: otc_penalty(n, m, cfg.max_calls),
    "otc_strict": _otc_strict,
}


@REWARD_SHAPERS.register(
    "search_cost",
    formula="r_i *= p(n_i, m) if r_i > 0 (n_i: tool calls, m: fewest among the group's rewarded rollouts); "
            "exp: p = lambda^(n - m); otc: sin(f pi / 2m), f = 2nm / (n + m) (m = 0: cos(n pi / (2n + C)))",
    paper=MASH,
    settings=SearchCostSettings,
)
def search_cost(rewards: Tensor, tool_calls: Tensor, group_index: Tensor, cfg: SearchCostSettings) -> Shaping:
    """MASH's pay-per-search reward: the term added is r_i (p(n_i, m) - 1) on rows with r_i > 0, 0 elsewhere
    (``otc_strict``: -r_i for a rewarded row with calls in a group where m = 0)."""
    rewarded = rewards > 0
    n = tool_calls.to(torch.float64)
    m = fewest_calls(tool_calls, rewarded, group_index)
    m_known = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # only rows of groups with a reward use m
    p = _PENALTIES[cfg.penalty](n, m_known, cfg)
    r = rewards.to(torch.float64)
    return Shaping(reward=torch.where(rewarded, r * (p - 1), torch.zeros_like(r)))
