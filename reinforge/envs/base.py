"""The Environment protocol of shared/DESIGN.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from reinforge.types import Task

Message = dict[str, str]


@dataclass
class StepResult:
    observation: list[Message]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    """``reset`` and ``step``. An environment may also have ``state_key() -> str``: the key of its current
    state, equal for equal states (GiGPO's anchor states, orchestrate/multi_turn.py ``state_key``; without
    it the observation's text is the key)."""

    def reset(self, task: Task, seed: int) -> list[Message] | str: ...
    def step(self, assistant: Message) -> StepResult: ...
