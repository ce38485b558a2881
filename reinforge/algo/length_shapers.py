"""Length and budget control: reward shapers that make a correct answer worth more when it is shorter
(registered in ``REWARD_SHAPERS``; docs/algorithms.md, "Length and budget control").

- ``conciser_length``: ConciseR's stage-2 (L-GRPO) length-aware reward, only in groups whose every
  rollout is correct, growing with the length budget left unused.
- ``hbpo_budget``: HBPO's budget-aware piecewise reward (cosine in the length, a deviation penalty past
  the budget), each subgroup of a group under its own token budget.
- ``kimi_length``: Kimi k1.5's group length reward, min-max normalised lengths within the group.

Each reads ``correct`` (``ShapeInputs.correct``: the verifier's verdict per sequence; ``rewards > 0``
when a caller gives none). Group statistics are scatter reductions over ``group_index``; a row with a
negative group index (a demonstration) is a group of its own. Every shaper returns the term *added* to
the reward; where the paper's reward replaces the verifier's, the term is the difference.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, field_validator
from torch import Tensor

from reinforge.algo.groups import dense_groups, group_reduce, rank_in_group
from reinforge.algo.shaping import REWARD_SHAPERS, Shaping
from reinforge.registry import Settings

CONCISER = "Song & Zheng 2025, Walk Before You Run! Concise LLM Reasoning via RL (ConciseR, arXiv:2505.21178, L-GRPO)"
HBPO = "Lyu et al. 2025, Hierarchical Budget Policy Optimization for Adaptive Reasoning (HBPO, arXiv:2507.15844, eq. 1-3)"
KIMI = "Kimi Team 2025, Kimi k1.5: Scaling Reinforcement Learning with LLMs (arXiv:2501.12599, section 2.3.3)"


def correctness(correct: Tensor | None, rewards: Tensor) -> Tensor:
    return correct.to(torch.bool) if correct is not None else rewards > 0


# ----------------------------------------------------------------------------------------- ConciseR


class ConciseRSettings(Settings):
    alpha: float = Field(1.0, gt=0, description="weight of the unused length budget (L_max - L) / L_max")
    max_length: int | None = Field(None, ge=1, description="L_max, the length budget (default: rollout.max_new_tokens)")


@REWARD_SHAPERS.register(
    "conciser_length",
    formula="r_i += alpha * (L_max - L_i) / L_max if every rollout of i's group is correct, else 0",
    paper=CONCISER,
    settings=ConciseRSettings,
)
def conciser_length(rewards: Tensor, lengths: Tensor, group_index: Tensor, max_new_tokens: int,
                    cfg: ConciseRSettings, correct: Tensor | None = None) -> Shaping:
    """ConciseR's L-GRPO length-aware reward ("walk before you run"): a group whose G rollouts are all
    correct gets, per rollout, a bonus proportional to the fraction of the length budget it left
    unused; any group with a wrong rollout is untouched (accuracy first). L_max = ``cfg.max_length``
    or ``max_new_tokens``.

    Reconstructed: the paper's method section could not be read for this implementation. From its
    abstract: length is optimised only once all rollouts of a sample are correct; the bonus growing
    with the remaining length budget, its linear form and the weight ``alpha`` are this
    implementation's. With GRPO's std-scaled group advantages every positive ``alpha`` (and any added
    constant, e.g. a reward of 1 replaced by 1 + bonus) gives the same advantages in an all-correct
    group: only the ordering by length and its linear spacing matter. Lengths over L_max (multi-turn
    totals) get a negative bonus.
    """
    ok = correctness(correct, rewards)
    gid, n_groups = dense_groups(group_index)
    if n_groups == 0:
        return Shaping(reward=torch.zeros(0, dtype=torch.float64))
    all_ok = group_reduce(ok.to(torch.float64), gid, n_groups, "amin") > 0
    budget = float(cfg.max_length or max_new_tokens)
    left = (budget - lengths.to(torch.float64)) / budget
    return Shaping(reward=torch.where(all_ok, cfg.alpha * left, torch.zeros_like(left)))


# -------------------------------------------------------------------------------------------- HBPO


class HBPOSettings(Settings):
    budgets: list[float] = Field([0.125, 0.25, 0.5, 0.625], min_length=1, description="the subgroups' token "
                                 "budgets b_k as fractions of L_max (HBPO: 512, 1024, 2048, 2560 of 4096)")
    beta: float = Field(4.0, gt=0, description="beta, the scale of the cosine reward (the authors' code: 4)")
    deviation: float = Field(1.0, ge=0, description="alpha * L_max: the penalty per L_max tokens of |n - b| "
                             "past the budget (the authors' code: alpha = 1/4096 with L_max = 4096)")

    @field_validator("budgets")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(not 0 < b <= 1 for b in v):
            raise ValueError(f"budgets are fractions of L_max in (0, 1], got {v}")
        return v


def hbpo_reward(n: Tensor, b: Tensor, correct: Tensor, l_max: float, beta: float, alpha: float) -> Tensor:
    """HBPO's R(n | b) [N] (eq. 1-3): f_1 = beta cos(pi n / 2 L_max) - alpha |n - b| if correct and
    b < n <= L_max; f_2 = beta cos(pi b / 2 L_max) if correct and n <= b; 0 otherwise."""
    n, b = n.to(torch.float64), b.to(torch.float64)
    f1 = beta * torch.cos(math.pi * n / (2 * l_max)) - alpha * (n - b).abs()
    f2 = beta * torch.cos(math.pi * b / (2 * l_max))
    inside = torch.where(n > b, f1, f2)
    return torch.where(correct & (n <= l_max), inside, torch.zeros_like(inside))


def subgroup_budgets(group_index: Tensor, budgets: list[float], l_max: int) -> Tensor:
    """b [N] (tokens): row j of a group of G rows is in subgroup k = floor(j K / G) of K budgets and gets
    b_k = round(budgets[k] * L_max) (HBPO's equal partition of a group's rollouts)."""
    gid, n_groups = dense_groups(group_index)
    table = torch.tensor([round(f * l_max) for f in budgets], dtype=torch.float64)
    if n_groups == 0:
        return torch.zeros(0, dtype=torch.float64)
    rank, size = rank_in_group(gid, n_groups)
    return table[(rank * len(budgets)) // size]


@REWARD_SHAPERS.register(
    "hbpo_budget",
    formula="r_i <- R(n_i | b_i): beta cos(pi n / 2 L_max) - alpha |n - b| if correct and b < n <= L_max; "
            "beta cos(pi b / 2 L_max) if correct and n <= b; 0 otherwise",
    paper=HBPO,
    settings=HBPOSettings,
)
def hbpo_budget(rewards: Tensor, lengths: Tensor, group_index: Tensor, max_new_tokens: int, cfg: HBPOSettings,
                correct: Tensor | None = None) -> Shaping:
    """HBPO's budget-aware reward (section 3.2, eq. 1-3), which replaces the verifier's: the term added is
    R(n | b) - r. L_max = ``max_new_tokens``; a group's rows split in order into K equal subgroups, the
    k-th under budget b_k (``subgroup_budgets``); alpha = ``cfg.deviation`` / L_max.

    Within its budget a correct answer gets f_2(b), the same for every length (exploration is free);
    past it the cosine decay and the deviation penalty pull it back; smaller budgets pay more. The
    ``hbpo_budgets`` group sampler prompts subgroup k with its budget in the same order, so the budget
    a row is scored under is the one it was asked for. Departures: the paper's f_2(b) for n <= b is
    used, not the authors' code's min(f_1, f_2) (lower than f_2 for very short answers); the code's
    format-error reward (-1) is the verifier's business here; HBPO's advantage (intra-subgroup
    mean - f_2(b), plus the group-normalised reward) is not built in: with ``grpo`` the advantage is
    the inter-subgroup term alone.
    """
    ok = correctness(correct, rewards)
    b = subgroup_budgets(group_index, cfg.budgets, max_new_tokens)
    target = hbpo_reward(lengths, b, ok, float(max_new_tokens), cfg.beta, cfg.deviation / max_new_tokens)
    return Shaping(reward=target - rewards.to(torch.float64))


# -------------------------------------------------------------------------------------------- Kimi


class KimiLengthSettings(Settings):
    weight: float = Field(1.0, ge=0, description="weight of the length reward added to the reward")


@REWARD_SHAPERS.register(
    "kimi_length",
    formula="r_i += w * (lambda_i if correct else min(0, lambda_i)), lambda_i = 0.5 - (L_i - min_g L) / "
            "(max_g L - min_g L) (0 when all lengths are equal)",
    paper=KIMI,
    settings=KimiLengthSettings,
)
def kimi_length(rewards: Tensor, lengths: Tensor, group_index: Tensor, cfg: KimiLengthSettings,
                correct: Tensor | None = None) -> Shaping:
    """Kimi k1.5's length reward (section 2.3.3): within the k samples of a prompt, lambda runs from 0.5
    (the shortest) to -0.5 (the longest); a correct answer gets lambda, a wrong one min(0, lambda) (a
    short wrong answer is not rewarded, a long one is penalised). min/max are over all the group's
    samples, right or wrong. Added to the reward with weight ``cfg.weight``.

    Choices: a group whose lengths are all equal (a group of one included) gets 0 (the formula is
    0/0); the paper's warm-up (training without the penalty first) is the recipe's to schedule.
    """
    ok = correctness(correct, rewards)
    gid, n_groups = dense_groups(group_index)
    if n_groups == 0:
        return Shaping(reward=torch.zeros(0, dtype=torch.float64))
    length = lengths.to(torch.float64)
    lo, hi = group_reduce(length, gid, n_groups, "amin"), group_reduce(length, gid, n_groups, "amax")
    span = hi - lo
    lam = torch.where(span > 0, 0.5 - (length - lo) / span.clamp(min=1e-12), torch.zeros_like(length))
    return Shaping(reward=cfg.weight * torch.where(ok, lam, lam.clamp(max=0.0)))
