"""Weighted composition of named reward terms, with a per-term error policy and per-step metrics.

``CompositeReward`` is itself a Verifier: ``r = sum_i w_i * r_i``; ``correct`` and ``answer`` are
those of the primary term (the one marked ``primary``, else the first). Each term's raw value
``r_i`` (before weighting) and each term's error are kept on the result for logging
(``term_metrics``). A term's ``params`` are laid over ``task.metadata`` for that term's call (the
params win), which is how registered verifiers are configured (``length_penalty``'s ``max_len``).

Error policy (``on_error``), for a term that raises, returns something other than a
``RewardResult`` or a non-finite reward:
- ``"raise"`` (default): raise ``RewardTermError`` naming the term, the task id and the completion
  (truncated). A broken reward function stops the run at its first error instead of training on zeros.
- ``"zero"``: the term scores 0 for that sample; the error is kept on the result (``errors``),
  counted (``error_counts``) and logged: a warning with the sample on the term's first error, debug after.
Timeouts are the caller's: ``VerifierPool`` bounds each call of the whole composite.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from reinforge.errors import ConfigError, ReinforgeError
from reinforge.rewards.imported import resolve_verifier
from reinforge.rewards.verifiers import VERIFIERS, RewardResult, Verifier
from reinforge.types import Task

log = logging.getLogger(__name__)

OnError = Literal["raise", "zero"]
_SAMPLE_CHARS = 500


class RewardTermError(ReinforgeError):
    """A reward term failed and the policy is ``on_error="raise"``."""


@dataclass(frozen=True)
class RewardTerm:
    """One named term: a registered verifier name or any Verifier callable, its weight, and ``params``
    laid over ``task.metadata`` when it is called."""

    name: str
    verifier: str | Verifier
    weight: float = 1.0
    primary: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompositeRewardResult(RewardResult):
    """A ``RewardResult`` with each term's raw value and each failed term's error."""

    terms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def _resolve(term: RewardTerm) -> Verifier:
    if isinstance(term.verifier, str):
        return resolve_verifier(term.verifier)
    if not callable(term.verifier):
        raise ConfigError(f"reward term {term.name!r}: verifier must be a registered name or a callable, "
                          f"got {type(term.verifier).__name__}")
    return term.verifier


class CompositeReward:
    """``r = sum_i w_i r_i`` over named terms; see the module docstring for ``correct`` and errors."""

    def __init__(self, terms: Sequence[RewardTerm], on_error: OnError = "raise") -> None:
        if on_error not in ("raise", "zero"):
            raise ConfigError(f"reward.on_error must be 'raise' or 'zero', got {on_error!r}")
        if not terms:
            raise ConfigError("a composite reward needs at least one term")
        names = [t.name for t in terms]
        for name in names:
            if not name or "/" in name or name == "errors" or names.count(name) > 1:
                raise ConfigError(f"reward term names must be unique, non-empty, without '/' and not 'errors'; "
                                  f"got {names}")
        if any(not math.isfinite(t.weight) for t in terms):
            raise ConfigError(f"reward term weights must be finite, got {[t.weight for t in terms]}")
        primaries = [t for t in terms if t.primary]
        if len(primaries) > 1:
            raise ConfigError(f"at most one reward term may be primary, got {[t.name for t in primaries]}")
        self.terms = list(terms)
        self.primary = primaries[0] if primaries else self.terms[0]
        self.on_error = on_error
        self._fns: list[tuple[RewardTerm, Verifier]] = [(t, _resolve(t)) for t in self.terms]
        self.error_counts: dict[str, int] = {t.name: 0 for t in self.terms}
        self._warned: set[str] = set()

    def __call__(self, task: Task, completion: str) -> CompositeRewardResult:
        values: dict[str, float] = {}
        errors: dict[str, str] = {}
        total, primary = 0.0, None
        for term, fn in self._fns:
            call_task = replace(task, metadata={**task.metadata, **term.params}) if term.params else task
            try:
                result = fn(call_task, completion)
                if not isinstance(result, RewardResult):
                    raise TypeError(f"returned {type(result).__name__}, not a RewardResult")
                value = float(result.reward)
                if not math.isfinite(value):
                    raise ValueError(f"returned a non-finite reward {value}")
            except Exception as exc:
                errors[term.name] = self._failed(term, task, completion, exc)
                values[term.name] = 0.0
                continue
            values[term.name] = value
            total += term.weight * value
            if term is self.primary:
                primary = result
        return CompositeRewardResult(
            total, primary.correct if primary else False, primary.answer if primary else None,
            terms=values, errors=errors,
        )

    def _failed(self, term: RewardTerm, task: Task, completion: str, exc: Exception) -> str:
        self.error_counts[term.name] += 1
        error = f"{type(exc).__name__}: {exc}"
        message = (f"reward term {term.name!r} failed on task {task.id!r}: {error}; "
                   f"completion: {completion[:_SAMPLE_CHARS]!r}")
        if self.on_error == "raise":
            raise RewardTermError(message + " (set reward.on_error: zero to score such samples 0)") from exc
        if term.name in self._warned:
            log.debug(message)
        else:
            self._warned.add(term.name)
            log.warning(message + " (scored 0; later errors of this term are counted, not warned)")
        return error


def term_metrics(results: Sequence[RewardResult | None]) -> dict[str, float]:
    """One step's per-term metrics: ``reward/<term>`` = mean raw value of the term over the step's
    samples (a failed term counts as its 0), ``reward/errors/<term>`` = how many samples it failed on.
    Results that are not ``CompositeRewardResult`` (or None: a timed-out call) are skipped."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    errors: dict[str, int] = {}
    for result in results:
        if not isinstance(result, CompositeRewardResult):
            continue
        for name, value in result.terms.items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
            errors.setdefault(name, 0)
        for name in result.errors:
            errors[name] = errors.get(name, 0) + 1
    metrics = {f"reward/{name}": sums[name] / counts[name] for name in sums}
    metrics.update({f"reward/errors/{name}": float(n) for name, n in errors.items()})
    return metrics


# ----------------------------------------------------------------------------------------------
# A length term


@VERIFIERS.register(
    "length_penalty",
    formula="r = 0 if n <= T; -(n - T) / (L - T) if T < n <= L; -1 if n > L "
            "(n = completion length, L = max_len, T = target, default L)",
    paper="Yu et al. 2025, DAPO soft overlong punishment (arXiv:2503.14476), on text length",
)
def length_penalty(task: Task, completion: str) -> RewardResult:
    """A penalty in [-1, 0] that ramps linearly from 0 at ``target`` to -1 at ``max_len`` and stays -1
    beyond. Params (``task.metadata`` or the term's ``params``): ``max_len`` (required), ``target``
    (default ``max_len``: a hard cut-off), ``length_unit`` "chars" (default) or "words". The
    length is of the text (a Verifier sees no tokens); DAPO's token-level shaping is ``algo.shaping.soft_overlong_penalty``.
    ``correct`` is ``n <= max_len``."""
    meta = task.metadata
    if "max_len" not in meta:
        raise ValueError(f"task {task.id!r}: length_penalty needs max_len (in the term's params)")
    max_len = float(meta["max_len"])
    target = float(meta.get("target", max_len))
    unit = meta.get("length_unit", "chars")
    if not 0 <= target <= max_len:
        raise ValueError(f"length_penalty needs 0 <= target <= max_len, got target={target}, max_len={max_len}")
    counters: dict[str, Callable[[str], int]] = {"chars": len, "words": lambda s: len(s.split())}
    if unit not in counters:
        raise ValueError(f"length_penalty length_unit must be 'chars' or 'words', got {unit!r}")
    n = counters[unit](completion)
    if n <= target:
        reward = 0.0
    elif n <= max_len:
        reward = -(n - target) / (max_len - target)
    else:
        reward = -1.0
    return RewardResult(reward, n <= max_len, None)
