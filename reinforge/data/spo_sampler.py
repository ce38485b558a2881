"""SPO's prioritized prompt sampling: prompts drawn in proportion to the spread of their tracked success.

Xu & Ding 2025, "Single-stream Policy Optimization" (arXiv:2509.13232): the persistent per-prompt value
tracker "naturally enables an adaptive curriculum via prioritized sampling". Each prompt x keeps a
Beta(alpha_x, beta_x) estimate of its success rate (the tracker of ``algo/spo.py``), and a batch draws
prompts with probability proportional to

    w(x) = sqrt(p_x (1 - p_x)) + eps,   p_x = alpha_x / (alpha_x + beta_x)

(the Bernoulli reward's standard deviation at the tracked rate, largest for prompts the policy solves
half the time; ``eps``, 0.05 in the authors' code, keeps every prompt in play), without replacement,
from a candidate pool (the whole split by default). After each observed group of k samples with s
correct: alpha <- rho alpha + s, beta <- rho beta + (k - s) (a prompt never seen starts from the prior
alpha0 = n0 v0, beta0 = n0 (1 - v0)).

The sampler keeps its own estimates (from the verdicts the loop hands every task sampler) instead of
reading the learner's tracker: the sampler runs where the prompts are drawn (ahead of the learner in
asynchronous mode), it works with any advantage estimator, and its state is saved with the sampler's.
With ``algo.advantage: spo`` at ``rho_mode: constant``, 0/1 rewards and the same prior and rho, its
estimates are the tracker's (tests/test_samplers_spo.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field

from reinforge.data.base import TaskSampler
from reinforge.data.curriculum import StatsSampler
from reinforge.data.prompt_stats import GroupOutcome
from reinforge.data.samplers import TASK_SAMPLERS
from reinforge.registry import Settings
from reinforge.types import Task


class SPOSamplerSettings(Settings):
    exploration: float = Field(0.05, ge=0, description="eps added to every prompt's weight (the authors' "
                               "EXPLORATION_EPSILON)")
    prior_value: float = Field(0.5, ge=0, le=1, description="v0, the success rate of a prompt never seen")
    prior_count: float = Field(1.0, gt=0, description="n0 = alpha0 + beta0, the weight of the prior")
    rho: float = Field(0.875, gt=0, le=1, description="forgetting factor of the estimates per observed group "
                       "(SPO's constant rho)")
    pool: float = Field(0.0, ge=0, description="0: draw from the whole split; else candidates per batch slot, "
                        "ceil(pool x n) taken from uniform passes over the split (the authors' dataloader batch)")


def priority_weights(alpha: np.ndarray, beta: np.ndarray, exploration: float) -> np.ndarray:
    """w = sqrt(p (1 - p)) + eps with p = alpha / (alpha + beta)."""
    p = np.asarray(alpha, dtype=np.float64) / (np.asarray(alpha, dtype=np.float64) + np.asarray(beta, dtype=np.float64))
    return np.sqrt(p * (1.0 - p)) + exploration


def weighted_draw(weights: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """``n`` indices drawn with probability proportional to ``weights``: without replacement (one at a
    time among those left: Efraimidis and Spirakis' keys u^(1/w), the n largest) when there are at least
    ``n`` candidates, else with replacement. All-zero weights draw uniformly."""
    w = np.asarray(weights, dtype=np.float64)
    if not (w > 0).any():
        w = np.ones_like(w)
    u = rng.random(len(w))
    if n > len(w):
        return rng.choice(len(w), size=n, replace=True, p=w / w.sum()).tolist()
    with np.errstate(divide="ignore"):
        keys = np.where(w > 0, np.log(u) / np.where(w > 0, w, 1.0), -np.inf)
    return np.argsort(-keys, kind="stable")[:n].tolist()


@TASK_SAMPLERS.register(
    "spo",
    formula="P(x) proportional to sqrt(p_x (1 - p_x)) + eps, p_x = alpha_x / (alpha_x + beta_x); "
            "alpha <- rho alpha + s, beta <- rho beta + (k - s) per group",
    paper="2509.13232", settings=SPOSamplerSettings)
class SPOSampler(StatsSampler):
    """SPO's prioritized sampling over per-prompt Beta success estimates (module docstring)."""

    def __init__(self, tasks: Sequence[Task], seed: int, cfg: SPOSamplerSettings | None = None) -> None:
        super().__init__(tasks, seed, cfg or SPOSamplerSettings())
        self.order = TaskSampler(tasks, seed)  # candidate pools (pool > 0)
        self.estimates: dict[str, tuple[float, float]] = {}
        self.last: dict[str, float] = {}

    def estimate(self, task_id: str) -> tuple[float, float]:
        c = self.cfg
        return self.estimates.get(task_id, (c.prior_count * c.prior_value, c.prior_count * (1.0 - c.prior_value)))

    def next_batch(self, n: int) -> list[Task]:
        self.draws += 1
        candidates = (self.order.next_batch(min(len(self.tasks), math.ceil(self.cfg.pool * n))) if self.cfg.pool
                      else list(self.tasks))
        ab = np.array([self.estimate(t.id) for t in candidates], dtype=np.float64)
        weights = priority_weights(ab[:, 0], ab[:, 1], self.cfg.exploration)
        chosen = weighted_draw(weights, n, np.random.default_rng([self.seed, 17, self.draws]))
        self.last = {"sampler/priority_mean": float(weights[chosen].mean()),
                     "sampler/value_mean": float((ab[chosen, 0] / ab[chosen].sum(-1)).mean())}
        return [candidates[i] for i in chosen]

    def learn(self, groups: list[GroupOutcome]) -> None:
        rho = self.cfg.rho
        for g in groups:
            a, b = self.estimate(g.task_id)
            s = sum(g.correct)
            self.estimates[g.task_id] = (rho * a + s, rho * b + len(g.correct) - s)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.last}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "order": self.order.state_dict(),
                "estimates": {k: list(v) for k, v in self.estimates.items()}, "last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.order.load_state_dict(state["order"])
        self.estimates = {k: (float(v[0]), float(v[1])) for k, v in state["estimates"].items()}
        self.last = {k: float(v) for k, v in state["last"].items()}
