"""The step's rollout records, read and written by the stages between collection and the batch:
a ``Round`` (one collection of groups, what a rollout worker returns too) and a ``Rollout`` (what one
step sampled and what it trains on). Batch sources (batch_sources.py, async_batches.py,
demo_batches.py) fill them; the stages after collection (stages.py) update them in place."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reinforge.types import Task, Trajectory


@dataclass
class Rollout:
    """What one step sampled (``sampled``, for metrics) and what it trains on (``kept``), with the
    greedy baseline of each kept trajectory when the estimator needs one, and the source's metrics.
    ``tokens_reused``: generated tokens in ``kept`` that this step did not decode (e.g. replayed samples;
    a group sampler reports its own per sample in ``Trajectory.metadata['tokens_reused']``)."""

    sampled: list[Trajectory] = field(default_factory=list)
    kept: list[Trajectory] = field(default_factory=list)
    baseline: list[float] | None = None
    rounds: int = 0
    reward_s: float = 0.0
    env_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    tokens_reused: int = 0


@dataclass
class Round:
    """One collection of groups (a request's worth): trajectories, per-task greedy baselines (or
    None), the seconds spent generating, scoring and waiting on environments, and the environment
    calls' counters."""

    trajectories: list[Trajectory]
    baseline: list[float] | None = None
    generate_s: float = 0.0
    reward_s: float = 0.0
    env_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


class StatelessStage:
    """A stage after collection that keeps nothing across steps: an empty checkpoint state."""

    key = None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


class KeptRowsStage(StatelessStage):
    """A stateless stage whose work annotates the kept rows: ``work(tasks, kept, params) -> metrics``
    (VinePPO's state values, IGPO's answer probabilities)."""

    reads: tuple[str, ...] = ("kept",)

    def __init__(self, work: Callable[[Mapping[str, Task], list[Trajectory], Any], dict[str, float]],
                 params: Any) -> None:
        self.work, self.params = work, params

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        return self.work(tasks, rollout.kept, self.params)
