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
    it the observation's text is the key).

    Roles (docs/multi_agent.md): an environment may have ``role() -> str``, whose turn the model's next turn
    is (asked after ``reset`` and after every step that does not end the episode); the model turn is tagged
    with it. A step may give each role its own reward, ``StepResult.info["role_rewards"] = {role: reward}``
    (zero-sum: ``{winner: 1, loser: -1}``); a step that does not credits its ``reward`` to the role that
    played the turn. ``StepResult.reward`` stays the episode's (team) reward. ``info["winner"]`` (a role)
    is counted into the per-role win rates."""

    def reset(self, task: Task, seed: int) -> list[Message] | str: ...
    def step(self, assistant: Message) -> StepResult: ...
