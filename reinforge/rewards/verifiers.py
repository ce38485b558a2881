"""Verifiers: pure functions ``(task, completion) -> RewardResult``, registered by name."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from reinforge.registry import Registry, kind
from reinforge.types import Task


@dataclass(frozen=True)
class RewardResult:
    """``reward`` for training, ``correct`` for accuracy metrics, and the ``answer`` the verifier
    read from the completion (normalised; used for majority voting, maj@k), if it has one."""

    reward: float
    correct: bool
    answer: str | None = None


Verifier = Callable[[Task, str], RewardResult]
VERIFIERS: Registry[Verifier] = kind("verifier", Registry("verifier"))
CPU_BOUND = "cpu_bound"
"""A verifier's declaration (``needs=(CPU_BOUND,)``): it computes in pure Python under the GIL, so it
is worth a process each (``reward.pool: auto`` then picks processes, ``rewards/build.py::pool_kind``)."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


@VERIFIERS.register("exact_match", formula="r = 1 if completion.strip() == answer.strip() else 0", paper="-")
def exact_match(task: Task, completion: str) -> RewardResult:
    """1 when the whitespace-stripped completion equals the answer exactly."""
    ok = completion.strip() == task.answer.strip()
    return RewardResult(float(ok), ok, completion.strip())


@VERIFIERS.register(
    "numeric_match", formula="r = 1 if the last number in the completion equals the answer numerically", paper="-"
)
def numeric_match(task: Task, completion: str) -> RewardResult:
    """1 when the last number (integer, decimal or a/b fraction) in the completion equals the answer."""
    found = _NUMBER.findall(completion)
    if not found:
        return RewardResult(0.0, False)
    try:
        value = Fraction(found[-1])
    except (ValueError, ZeroDivisionError):
        return RewardResult(0.0, False, found[-1])
    try:
        ok = value == Fraction(task.answer.strip())
    except (ValueError, ZeroDivisionError):
        ok = False
    return RewardResult(float(ok), ok, str(value))
