"""Retry: turn any single-turn environment into a multi-turn one that says "wrong, try again".

Episode: reset -> the inner environment's first messages. Each assistant turn is scored by the
inner environment (reset again before every attempt, with the same task and seed). A correct
attempt ends the episode with reward ``decay**(attempt - 1) * inner_reward``; a wrong one gets the
``feedback`` user message and another attempt. After ``max_attempts`` wrong attempts the episode
ends with the last attempt's inner reward scaled the same way (0 for a 0/1 verifier; a partial
credit, e.g. a format term, is kept so it stays comparable with the successful case).
"""

from __future__ import annotations

from typing import Any

from reinforge.envs.base import Environment, Message, StepResult
from reinforge.types import Task


class RetryEnv:
    """``info`` on every step: ``attempts`` so far; on the last step also ``correct`` and the inner
    environment's final info (e.g. ``reward_terms``). An attempt is correct when the inner info says
    ``correct``, or, without that key, when the inner reward is at least 1."""

    def __init__(
        self, inner: Environment, max_attempts: int = 3, feedback: str = "wrong, try again", decay: float = 1.0
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
        if not isinstance(feedback, str) or not feedback:
            raise ValueError(f"feedback must be a non-empty string, got {feedback!r}")
        self.inner, self.max_attempts, self.feedback, self.decay = inner, max_attempts, feedback, float(decay)
        self.task: Task | None = None

    def reset(self, task: Task, seed: int = 0) -> list[Message] | str:
        self.task, self.seed, self.attempts, self.done = task, seed, 0, False
        return self.inner.reset(task, seed)

    def step(self, assistant: Message) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        if self.attempts > 0:
            self.inner.reset(self.task, self.seed)
        self.attempts += 1
        result = self.inner.step(assistant)
        if not result.done:
            raise ValueError(f"RetryEnv wraps single-turn environments, but {type(self.inner).__name__} did not end after one step")
        correct = bool(result.info["correct"]) if "correct" in result.info else result.reward >= 1.0
        if correct or self.attempts >= self.max_attempts:
            self.done = True
            reward = self.decay ** (self.attempts - 1) * result.reward
            info: dict[str, Any] = {**result.info, "correct": correct, "attempts": self.attempts}
            return StepResult([], reward, True, info)
        return StepResult([{"role": "user", "content": self.feedback}], 0.0, False, {"attempts": self.attempts})
