"""Number guessing: find the task's secret with "higher" / "lower" hints.

Episode: reset -> the task prompt as a user message (``"guess 1-32"``). Each assistant turn's
last integer is a guess; the reply is a user message ``"higher"`` or ``"lower"``, or
``"say a number"`` when the turn has no integer (it still uses up a guess). A correct guess ends
the episode with reward 1.0; running out of guesses ends it with reward 0.0.
"""

from __future__ import annotations

from reinforge.envs.base import Message, StepResult
from reinforge.envs.calculator import last_integer, task_messages
from reinforge.types import Task

HIGHER, LOWER, NO_NUMBER = "higher", "lower", "say a number"


class GuessingEnv:
    """The secret is ``int(task.answer)``. ``info``: ``guesses`` (turns so far) on every step, and
    ``correct`` on the last step. ``state_key()``: the interval the hints allow and the guesses left."""

    def __init__(self, max_guesses: int = 6, system_prompt: str | None = None) -> None:
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"max_guesses must be an integer >= 1, got {max_guesses!r}")
        self.max_guesses = max_guesses
        self.system_prompt = system_prompt
        self.task: Task | None = None

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        try:
            self.secret = int(task.answer)
        except ValueError:
            raise ValueError(f"GuessingEnv needs an integer answer (the secret); task {task.id!r} has {task.answer!r}") from None
        self.task, self.guesses, self.done = task, 0, False
        self.low: int | None = None  # the interval the hints so far allow (None: no bound yet)
        self.high: int | None = None
        return task_messages(task, self.system_prompt)

    def step(self, assistant: Message) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        self.guesses += 1
        guess = last_integer(assistant.get("content") or "")
        if guess == self.secret:
            return self._end(True)
        if self.guesses >= self.max_guesses:
            return self._end(False)
        hint = NO_NUMBER if guess is None else HIGHER if guess < self.secret else LOWER
        if guess is not None and guess < self.secret:
            self.low = guess + 1 if self.low is None else max(self.low, guess + 1)
        elif guess is not None:
            self.high = guess - 1 if self.high is None else min(self.high, guess - 1)
        return StepResult([{"role": "user", "content": hint}], 0.0, False, {"guesses": self.guesses})

    def state_key(self) -> str:
        """The player's situation: the interval the hints allow and the guesses left (GiGPO's anchor
        state: episodes whose hints narrowed the secret down alike face the same choice)."""
        return f"low={self.low} high={self.high} left={self.max_guesses - self.guesses}"

    def _end(self, correct: bool) -> StepResult:
        self.done = True
        return StepResult([], float(correct), True, {"correct": correct, "guesses": self.guesses})
