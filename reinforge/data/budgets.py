"""Rollout budgets: how many samples each prompt of a step gets (``rollout.budget``), registered by name.

A budget part is a class built as ``cls([cfg])`` with ``allocate(tasks, group_size) -> list[int]`` (one
group size per task, in task order), ``observe(trajectories)`` (each step's scored samples),
``state_dict()``/``load_state_dict()`` (saved in checkpoints) and ``metrics()``. The batch source
samples each task's group with its own size (``batch_sources.collect_sized``).

Built in: ``uniform`` (every prompt ``rollout.group_size``: the default, the plain path) and
``knapsack``, Knapsack RL (Li et al. 2025, "Knapsack RL: Unlocking Exploration of LLMs via
Optimizing Budget Allocation", arXiv:2509.25849): a prompt with success rate p given N samples is an
item of cost N and value

    Value(N, p) = ProbNonZeroGradient(N, p) * InfoGain(p) = (1 - p^N - (1 - p)^N) * p (1 - p)^2,

(the chance that a GRPO group of N has a reward spread, times the expected gain in success
probability of one update on it); the step's budget sum_i N_i <= B (B = prompts x group_size by
default: as many samples as the uniform allocation) is divided by solving the knapsack exactly
(dynamic programming over the budget), N_low <= N_i <= N_up. Before the knapsack, the authors' fallback
rule (``sampling_budget_by_knapsack`` in their code, liziniu/KnapsackRL) reserves for each prompt with
0 < p < 1 only the samples its group needs for a reward spread with probability alpha,
floor(min(N_up, ln(1 - alpha) / ln(max(p, 1 - p)))), and hands the rest of the budget to the prompts
never solved (p = 0), split evenly. docs/strategies.md lists what was checked and the choices left
(unseen prompts, which success rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field, model_validator

from reinforge.data.prompt_stats import PromptStats
from reinforge.registry import Registry, Settings, kind
from reinforge.types import Task

KNAPSACK_PAPER = "Knapsack RL, Li et al. 2025, arXiv:2509.25849"


class BudgetPart(Protocol):
    def allocate(self, tasks: Sequence[Task], group_size: int) -> list[int]: ...
    def observe(self, trajectories: Sequence[Any]) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def metrics(self) -> dict[str, float]: ...


BUDGETS: Registry[type[BudgetPart]] = kind("budget", Registry("rollout budget"))


@BUDGETS.register("uniform", formula="N_i = G for every prompt", paper="-")
class UniformBudget:
    """Every prompt ``group_size`` samples (what a run does without a budget part)."""

    def allocate(self, tasks: Sequence[Task], group_size: int) -> list[int]:
        return [group_size] * len(tasks)

    def observe(self, trajectories: Sequence[Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


class KnapsackSettings(Settings):
    """The budget, the bounds per prompt and which success rate values a prompt."""

    total: int = Field(0, ge=0, description="samples per step B (0 = prompts_per_step x group_size)")
    min_per_prompt: int = Field(2, ge=1, description="N_low, the fewest samples a prompt gets")
    max_per_prompt: int = Field(128, ge=1, description="N_up, the most samples the knapsack gives a prompt (the "
                                "authors' run script: 128)")
    estimate: Literal["last", "all"] = Field(
        "last", description="p from the prompt's last group (the paper's: its last visit) or from all its samples")
    confidence: float = Field(0.9, gt=0, lt=1, description="alpha of the fallback: a prompt with 0 < p < 1 is "
                              "reserved the samples that give its group a reward spread with probability alpha")
    fallback: bool = Field(True, description="the authors' fallback: what the reserves leave goes to the prompts "
                           "never solved (false: the knapsack divides the whole budget)")

    @model_validator(mode="after")
    def _bounds(self) -> KnapsackSettings:
        if self.max_per_prompt < self.min_per_prompt:
            raise ValueError(f"max_per_prompt ({self.max_per_prompt}) < min_per_prompt ({self.min_per_prompt})")
        return self


def task_value(n: np.ndarray, p: float) -> np.ndarray:
    """Value(N, p) = (1 - p^N - (1 - p)^N) * p (1 - p)^2 for every N in ``n``."""
    n = np.asarray(n, dtype=np.float64)
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def solve_knapsack(values: np.ndarray, low: int, budget: int) -> list[int]:
    """Exact DP: ``values[i, j]`` is item i's value with ``low + j`` samples; maximise the sum under
    sum_i N_i <= ``budget``. Among optimal allocations the one spending the least budget, and for an
    item the fewest samples, is returned (what adds no value is left to the caller)."""
    m, k = values.shape
    extra = budget - m * low
    if extra < 0:
        raise ValueError(f"a budget of {budget} samples cannot give {m} prompts {low} each")
    best = np.full(extra + 1, -np.inf)
    best[0] = 0.0
    choice = np.zeros((m, extra + 1), dtype=np.int64)
    for i in range(m):
        new = np.full(extra + 1, -np.inf)
        for j in range(min(k, extra + 1)):
            cand = np.full(extra + 1, -np.inf)
            cand[j:] = best[:extra + 1 - j] + values[i, j]
            better = cand > new  # strict: the fewer samples win a tie
            new[better], choice[i, better] = cand[better], j
        best = new
    b = int(np.argmax(best))  # the first maximum: the least budget spent
    sizes = [0] * m
    for i in reversed(range(m)):
        j = int(choice[i, b])
        sizes[i], b = low + j, b - j
    return sizes


def reserved_samples(p: float, high: int, confidence: float) -> int:
    """floor(min(N_up, ln(1 - alpha) / ln(max(p, 1 - p)))) for 0 < p < 1 (the authors' cost): the group size
    at which max(p, 1 - p)^N, the larger of the two chances that all N samples agree, falls to 1 - alpha."""
    return int(min(high, math.log(1.0 - confidence) / math.log(max(p, 1.0 - p))))


def spread(sizes: list[int], pool: Sequence[int], extra: int) -> None:
    """``extra`` samples split evenly over the indices ``pool``, one more to each of the first
    ``extra % len(pool)`` (in order), as the authors' code splits its fallback budget. In place."""
    per, rest = divmod(extra, len(pool))
    for k, i in enumerate(pool):
        sizes[i] += per + (1 if k < rest else 0)


def fallback(sizes: list[int], rates: Sequence[float | None], budget: int, cfg: KnapsackSettings) -> tuple[int, int]:
    """The authors' fallback rule before the knapsack, on ``sizes`` (N_low for the seen prompts, the unseen
    ones' size) in place: returns (the knapsack's budget beyond N_low for the prompts with 0 < p < 1, the
    samples the fallback handed out). With such prompts, each is reserved ``reserved_samples``; if the
    reserves sum to less than what is left, the rest goes evenly to the prompts with p = 0 (none: to
    every other prompt, p = 1 and unseen) and the knapsack divides the reserves. Without such prompts,
    what is left goes to the p = 0 prompts; with none, the budget is divided evenly over all prompts (the
    code's uniform allocation)."""
    left = budget - sum(sizes)
    valued = [i for i, p in enumerate(rates) if p is not None and 0.0 < p < 1.0]
    unsolved = [i for i, p in enumerate(rates) if p == 0.0]
    if left <= 0 or (valued and not cfg.fallback):
        return max(left, 0), 0
    if not valued:
        if unsolved:
            spread(sizes, unsolved, left)
        else:
            sizes[:] = [0] * len(sizes)
            spread(sizes, range(len(sizes)), budget)
        return 0, left
    reserve = sum(reserved_samples(float(rates[i]), cfg.max_per_prompt, cfg.confidence) for i in valued)
    if reserve >= left:
        return left, 0
    spread(sizes, unsolved or [i for i in range(len(sizes)) if i not in valued], left - reserve)
    return reserve, left - reserve


@BUDGETS.register("knapsack", formula="max sum_i (1 - p_i^N_i - (1 - p_i)^N_i) p_i (1 - p_i)^2 s.t. sum_i N_i <= B, "
                  "N_low <= N_i <= N_up", paper=KNAPSACK_PAPER, settings=KnapsackSettings)
class KnapsackBudget:
    """Knapsack RL's allocation over the per-prompt success rates of ``PromptStats`` (module docstring).
    Prompts never seen get ``group_size`` (clamped to the bounds) and stay out of the knapsack (the
    fallback may add to them when no prompt is unsolved, as the authors' code does)."""

    def __init__(self, cfg: KnapsackSettings | None = None) -> None:
        self.cfg = cfg or KnapsackSettings()
        self.stats = PromptStats()
        self.last_rate: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def rate(self, task_id: str) -> float | None:
        record = self.stats.get(task_id)
        if record is None:
            return None
        return self.last_rate[task_id] if self.cfg.estimate == "last" else record.success_rate

    def allocate(self, tasks: Sequence[Task], group_size: int) -> list[int]:
        cfg = self.cfg
        budget = cfg.total or len(tasks) * group_size
        rates = [self.rate(t.id) for t in tasks]
        unseen = min(max(group_size, cfg.min_per_prompt), cfg.max_per_prompt)
        sizes = [unseen if p is None else cfg.min_per_prompt for p in rates]
        if sum(sizes) > budget:
            n_seen = sum(p is not None for p in rates)
            raise ValueError(f"rollout.budget params total={budget}: too small for {len(tasks)} prompts "
                             f"({len(tasks) - n_seen} unseen at {unseen}, the others at least {cfg.min_per_prompt})")
        room, handed = fallback(sizes, rates, budget, cfg)
        valued = [i for i, p in enumerate(rates) if p is not None and 0.0 < p < 1.0]
        if valued:
            n = np.arange(cfg.min_per_prompt, cfg.max_per_prompt + 1)
            values = np.stack([task_value(n, float(rates[i])) for i in valued])
            chosen = solve_knapsack(values, cfg.min_per_prompt, cfg.min_per_prompt * len(valued) + room)
            for i, s in zip(valued, chosen, strict=True):
                sizes[i] = s
            spread(sizes, valued, cfg.min_per_prompt * len(valued) + room - sum(chosen))  # what adds no value
        value = sum(float(task_value(np.array([s]), float(p))[0]) for s, p in zip(sizes, rates, strict=True)
                    if p is not None)
        counts: dict[int, int] = {}
        for s in sizes:
            counts[s] = counts.get(s, 0) + 1
        self.last = {"budget/unseen_prompts": float(sum(p is None for p in rates)), "budget/value": value,
                     "budget/valued_prompts": float(len(valued)), "budget/fallback_samples": float(handed),
                     **{f"budget/hist/{s}": float(c) for s, c in sorted(counts.items())}}
        return sizes

    def observe(self, trajectories: Sequence[Any]) -> None:
        for g in self.stats.update(trajectories):
            self.last_rate[g.task_id] = sum(g.correct) / len(g.correct)

    def metrics(self) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"stats": self.stats.state_dict(), "last_rate": self.last_rate}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats.load_state_dict(state["stats"])
        self.last_rate = {k: float(v) for k, v in state["last_rate"].items()}


class _NoInputs:
    pass


def build_budget(name: str, settings: Any = None) -> BudgetPart:
    """The registered budget part ``name`` with its settings."""
    return BUDGETS.call(name, _NoInputs(), settings)
