"""Task samplers: which training prompts each step draws (``task.sampler``), registered by name.

A task sampler is a class built as ``cls(tasks, seed[, cfg])`` (its settings as ``cfg``) with
``next_batch(n) -> list[Task]``, ``observe(trajectories)`` (the loop hands it every scored
trajectory of a step, the place for curricula and per-prompt statistics) and
``state_dict()``/``load_state_dict()`` (saved in checkpoints, so a resumed run draws what the
uninterrupted one would have). An optional ``metrics() -> dict[str, float]`` adds the sampler's
own ``sampler/...`` keys to each step's record (docs/metrics.md).

Built in: ``uniform`` (here), ``difficulty_filter`` and ``dump`` (data/curriculum.py), ``insight``
(data/insight.py), ``spo`` (data/spo_sampler.py); per-prompt statistics in data/prompt_stats.py
(docs/strategies.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from reinforge.data.base import TaskSampler
from reinforge.registry import Registry, kind
from reinforge.types import Task


class TaskSamplerPart(Protocol):
    def next_batch(self, n: int) -> list[Task]: ...
    def observe(self, trajectories: Sequence[Any]) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


TASK_SAMPLERS: Registry[type[TaskSamplerPart]] = kind("task_sampler", Registry("task sampler"))

TASK_SAMPLERS.register(
    "uniform", formula="tasks drawn without replacement, reshuffled every epoch from the seed", paper="-",
)(TaskSampler)


class _SamplerInputs:
    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        self.tasks, self.seed = tasks, seed


def build_task_sampler(name: str, tasks: Sequence[Task], seed: int, settings: Any = None) -> TaskSamplerPart:
    """The registered sampler ``name`` over ``tasks``."""
    return TASK_SAMPLERS.call(name, _SamplerInputs(tasks, seed), settings)
