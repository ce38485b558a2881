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
(dynamic programming over the budget), N_low <= N_i <= N_up. docs/strategies.md lists the choices the
paper leaves open (unseen prompts, p = 0 or 1, which success rate).
"""

from __future__ import annotations

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
    max_per_prompt: int = Field(64, ge=1, description="N_up, the most samples a prompt gets")
    estimate: Literal["last", "all"] = Field(
        "last", description="p from the prompt's last group (the paper's: its last visit) or from all its samples")

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
    item the fewest samples, is returned (what adds no value is left to the caller's fallback)."""
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


def fallback(sizes: list[int], rates: Sequence[float | None], budget: int, high: int) -> list[int]:
    """The budget the knapsack left unspent, one sample at a time in turn: first to prompts never
    solved (p = 0), then to prompts always solved (p = 1), each up to ``high``."""
    sizes = list(sizes)
    left = budget - sum(sizes)
    for target in (0.0, 1.0):
        pool = [i for i, p in enumerate(rates) if p == target]
        while left > 0 and any(sizes[i] < high for i in pool):
            for i in pool:
                if left > 0 and sizes[i] < high:
                    sizes[i] += 1
                    left -= 1
    return sizes


@BUDGETS.register("knapsack", formula="max sum_i (1 - p_i^N_i - (1 - p_i)^N_i) p_i (1 - p_i)^2 s.t. sum_i N_i <= B, "
                  "N_low <= N_i <= N_up", paper=KNAPSACK_PAPER, settings=KnapsackSettings)
class KnapsackBudget:
    """Knapsack RL's allocation over the per-prompt success rates of ``PromptStats`` (module docstring).
    Prompts never seen get ``group_size`` (clamped to the bounds) and stay out of the knapsack."""

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
        seen = [i for i, p in enumerate(rates) if p is not None]
        sizes = [unseen] * len(tasks)
        room = budget - unseen * (len(tasks) - len(seen))
        if room < cfg.min_per_prompt * len(seen):
            raise ValueError(f"rollout.budget params total={budget}: too small for {len(tasks)} prompts "
                             f"({len(tasks) - len(seen)} unseen at {unseen}, the others at least {cfg.min_per_prompt})")
        if seen:
            n = np.arange(cfg.min_per_prompt, cfg.max_per_prompt + 1)
            values = np.stack([task_value(n, float(rates[i])) for i in seen])
            chosen = fallback(solve_knapsack(values, cfg.min_per_prompt, room), [rates[i] for i in seen], room,
                              cfg.max_per_prompt)
            for i, s in zip(seen, chosen, strict=True):
                sizes[i] = s
            value = sum(float(task_value(np.array([s]), float(rates[i]))[0]) for i, s in zip(seen, chosen, strict=True))
        else:
            value = 0.0
        counts: dict[int, int] = {}
        for s in sizes:
            counts[s] = counts.get(s, 0) + 1
        self.last = {"budget/unseen_prompts": float(len(tasks) - len(seen)), "budget/value": value,
                     "budget/valued_prompts": float(sum(p is not None and 0.0 < p < 1.0 for p in rates)),
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
