"""Bounded staleness for asynchronous RL: admission control and the staleness of a trajectory.

Versions: the learner publishes policy version v after its v-th update (v = 0 before training).
The rollout batch consumed by update k (which turns version k - 1 into k) was sampled by
behaviour versions b (per token; a trajectory's version is that of its first token). Its
staleness is lag = (k - 1) - b >= 0.

Admission: the request for the batch of update k may start only once the published version
is at least k - 1 - max_staleness. Sampling then uses a version >= k - 1 - max_staleness (weights
only move forward, also in flight), so every token of that batch has lag <= max_staleness.
``max_staleness = 0`` is synchronous RL: the batch for update k is sampled after update k - 1.
Groups that are staler anyway (a re-issued request after a worker restart, a bug) are dropped
and counted, never trained on (``split_stale``).
"""

from __future__ import annotations

from dataclasses import dataclass

from reinforge.types import Trajectory


@dataclass(frozen=True)
class AdmissionControl:
    max_staleness: int

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")

    def may_start(self, update: int, published_version: int) -> bool:
        """May the rollout batch for update ``update`` (1-based) start at ``published_version``?"""
        return published_version >= update - 1 - self.max_staleness

    def lag(self, update: int, behaviour_version: int) -> int:
        return (update - 1) - behaviour_version


def split_stale(trajs: list[Trajectory], update: int, control: AdmissionControl) -> tuple[list[Trajectory], int]:
    """The trajectories of groups whose every trajectory is within the bound, and how many groups
    were dropped (a group is kept or dropped whole: its baseline needs all its members)."""
    stale = {t.group_id for t in trajs if control.lag(update, t.version) > control.max_staleness}
    return [t for t in trajs if t.group_id not in stale], len(stale)
