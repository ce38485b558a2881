"""Problem synthesis by self-play (Absolute Zero, Zhao et al. 2025, arXiv:2505.03335): one policy, two roles.

A training episode: the ``proposer`` is shown the start of a task, an operand and an operator (``"12+"``,
``task.metadata["prefix"]``), and writes the rest of it (``"7"``, or ``"7*2"``, ``"(3-1)"``: any text of the
grammar); the environment's verifier parses and evaluates the whole (``"12+7"``) with a tiny parser
(reinforge/envs/expressions.py, never ``eval``) and checks the task family's rules; a valid task is then
put to the ``solver`` ``solves`` times (``"12+7="``, the model answers an integer), and the proposer is
rewarded by a registered proposer reward (reinforge/algo/proposer_rewards.py: ``learnability``, Absolute
Zero's ``0 if p in {0, 1} else 1 - p``, or ``spell_gaussian``) of the solver's mean success ``p``.

Rewards per role (``info["role_rewards"]``), Absolute Zero's with its format penalties:

- proposer: the proposer reward of ``p`` for a valid task; -0.5 for one that parses but breaks a rule (an
  operator not in ``ops``, an operand over ``max_operand``, a value outside ``[0, max_value]``); -1 for text
  that does not parse (a format error). Given on the last step.
- solver: 1 for a right answer, 0 for a wrong integer, -1 for a turn without an integer (format error).

Choices of ours, not the paper's: the proposer completes a seeded start (Absolute Zero conditions its
proposer on reference tasks from a buffer of the run's own; a 2.4M-parameter model almost never writes an
operator unprompted, so a blank prompt gives it no valid task to learn from); the solver's ``solves`` samples are turns of the one episode (the
collector plays one token sequence per episode), so each later attempt sees the earlier ones, with no
feedback on them; the task family is small integer arithmetic that a 2.4M-parameter model can hold; the
step reward (the team stream) is the solver's correctness / ``solves``, so an episode's reward is ``p``.
A held-out task (``task.metadata["expression"]``) skips the proposer: one solver turn, reward and
``correct`` its correctness, so ``eval.json`` is the solver's held-out accuracy. On a training episode
``correct`` is a valid task with ``0 < p < 1``. Deterministic (no randomness).
"""

from __future__ import annotations

from typing import Any

import torch

from reinforge.algo.proposer_rewards import PROPOSER_REWARDS
from reinforge.envs.base import Message, StepResult
from reinforge.envs.calculator import last_integer
from reinforge.envs.expressions import ExpressionError, parse_expression
from reinforge.registry import Entry
from reinforge.types import Task

PROPOSER, SOLVER = "proposer", "solver"
FORMAT_PENALTY, INVALID_PENALTY = -1.0, -0.5  # Absolute Zero: a format error; well-formed but not a valid task
OPERATORS = "+-*"


def proposer_reward_part(spec: str | dict[str, Any]) -> tuple[Entry, Any]:
    """The registered proposer reward ``spec`` names (a name, or ``{name, <option>: value}``) and its settings."""
    options = dict(spec) if isinstance(spec, dict) else {"name": spec}
    name = options.pop("name", None)
    if not isinstance(name, str) or name not in PROPOSER_REWARDS:
        raise ValueError(f"proposer_reward: unknown {name!r}; allowed: {', '.join(PROPOSER_REWARDS.names())}")
    entry = PROPOSER_REWARDS.entry(name)
    return entry, entry.make_settings(options, "env.proposer_reward")


def check_task(text: str, ops: str, max_operand: int, max_value: int) -> tuple[float | None, int | None]:
    """``(penalty, value)``: ``(None, value)`` for a valid task, else the format penalty and None."""
    try:
        parsed = parse_expression(text)
    except ExpressionError:
        return FORMAT_PENALTY, None
    valid = (bool(parsed.operators) and set(parsed.operators) <= set(ops) and max(parsed.numbers) <= max_operand and 0 <= parsed.value <= max_value)
    return (None, parsed.value) if valid else (INVALID_PENALTY, None)


class ProblemSynthesisEnv:
    """Proposer writes an arithmetic task, the solver answers it ``solves`` times; ``role()`` is whose turn."""

    def __init__(self, solves: int = 4, ops: str = "+", max_operand: int = 99, max_value: int = 200,
                 proposer_reward: str | dict[str, Any] = "learnability", system_prompt: str | None = None) -> None:
        if isinstance(solves, bool) or not isinstance(solves, int) or solves < 2:
            raise ValueError(f"solves must be an integer >= 2 (a success rate needs samples), got {solves!r}")
        if not ops or set(ops) - set(OPERATORS) or len(set(ops)) != len(ops):
            raise ValueError(f"ops must be distinct operators from {OPERATORS!r}, got {ops!r}")
        if min(max_operand, max_value) < 1:
            raise ValueError(f"max_operand and max_value must be >= 1, got {max_operand}, {max_value}")
        self.solves, self.ops, self.max_operand, self.max_value = solves, ops, max_operand, max_value
        self.reward_part, self.reward_settings = proposer_reward_part(proposer_reward)
        self.system_prompt = system_prompt
        self.done, self.turn = True, PROPOSER

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        self.done, self.successes, self.attempts = False, 0, 0
        expression = task.metadata.get("expression")
        if expression is not None:  # a held-out task: the solver alone, once
            penalty, value = check_task(str(expression), OPERATORS, 10 ** 4, 10 ** 8)
            if penalty is not None or value is None:
                raise ValueError(f"task {task.id!r}: {expression!r} is not a valid expression")
            self.expression, self.answer, self.budget, self.turn = str(expression), value, 1, SOLVER
            return self._messages(f"{self.expression}=")
        self.prefix = str(task.metadata.get("prefix", ""))
        self.budget, self.turn = self.solves, PROPOSER
        return self._messages(self.prefix or "task")

    def _messages(self, text: str) -> list[Message]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt is not None else []
        return [*system, {"role": "user", "content": text}]

    def role(self) -> str:
        return self.turn

    def state_key(self) -> str:
        return f"{self.turn}:{getattr(self, 'expression', '')}:{self.attempts}"

    def step(self, assistant: Message) -> StepResult:
        if self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        text = (assistant.get("content") or "").strip()
        return self._propose(text) if self.turn == PROPOSER else self._solve(text)

    def _propose(self, text: str) -> StepResult:
        text = self.prefix + text
        penalty, value = check_task(text, self.ops, self.max_operand, self.max_value)
        if penalty is not None or value is None:
            self.done = True
            return StepResult([], 0.0, True, {"role_rewards": {PROPOSER: penalty}, "correct": False, "valid": False,
                                               "format_error": penalty == FORMAT_PENALTY})
        self.expression, self.answer, self.turn = text.replace(" ", ""), value, SOLVER
        return StepResult([{"role": "user", "content": f"{self.expression}="}], 0.0, False,
                          {"role_rewards": {PROPOSER: 0.0}})

    def _solve(self, text: str) -> StepResult:
        answer = last_integer(text)
        right = answer == self.answer
        r_solve = FORMAT_PENALTY if answer is None else float(right)
        self.attempts += 1
        self.successes += int(right)
        step_reward = float(right) / self.budget
        if self.attempts < self.budget:
            return StepResult([{"role": "user", "content": f"{self.expression}="}], step_reward, False,
                              {"role_rewards": {SOLVER: r_solve}})
        self.done = True
        p = self.successes / self.budget
        if self.budget == 1:  # a held-out task
            return StepResult([], step_reward, True, {"role_rewards": {SOLVER: r_solve}, "correct": right})
        r_propose = float(self.reward_part.fn(torch.tensor([p], dtype=torch.float64), self.reward_settings)[0])
        return StepResult([], step_reward, True, {"role_rewards": {SOLVER: r_solve, PROPOSER: r_propose},
                                                  "correct": 0 < p < 1, "valid": True, "solve_rate": p})
