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
Group terms: a term whose verifier has ``score_group(task, completions)`` (the group and pairwise
judges, ``reinforge.rewards.judge_group``) is called once for all completions of a task
(``CompositeReward.score_group``, which ``VerifierPool`` calls when ``scores_groups``); its failure
fails the term for each completion of the group (raised, or 0 for each and counted per completion).
Counters a term's result reports (``stats``) are kept per term (``judge_metrics``).
Timeouts are the caller's: ``VerifierPool`` bounds each call of the whole composite (a whole group's).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    """A ``RewardResult`` with each term's raw value, each failed term's error, and the counters a term's
    result reports (``stats``, e.g. a pairwise judge's ``pairs`` and ``agreed``)."""

    terms: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)


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

    @property
    def scores_groups(self) -> bool:
        """Some term scores a whole group in one call (it has ``score_group``: the group and pairwise judges)."""
        return any(callable(getattr(fn, "score_group", None)) for _, fn in self._fns)

    def observe(self, tasks: Sequence[Task], completions: Sequence[str]) -> dict[str, float]:
        """A scored training batch to each term that learns from it (``observe``); their metrics, each
        under ``reward/<metric>/<term>``."""
        metrics: dict[str, float] = {}
        for term, fn in self._fns:
            observe = getattr(fn, "observe", None)
            if observe is not None:
                seen = observe([self._call_task(term, t) for t in tasks], completions)
                metrics |= {f"reward/{key}/{term.name}": value for key, value in seen.items()}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Each stateful term's state (``state_dict``), by term name."""
        return {term.name: fn.state_dict() for term, fn in self._fns if callable(getattr(fn, "state_dict", None))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for term, fn in self._fns:
            if term.name in state:
                fn.load_state_dict(state[term.name])

    def __call__(self, task: Task, completion: str) -> CompositeRewardResult:
        return self.score_group(task, [completion])[0] if self.scores_groups else self._combine(
            [self._sample_term(term, fn, task, completion) for term, fn in self._fns])

    def score_group(self, task: Task, completions: Sequence[str]) -> list[CompositeRewardResult]:
        """One result per completion of ``task``: a term with ``score_group`` is called once for the
        group (a failure fails the term for every completion), the others once per completion."""
        columns = [self._group_term(term, fn, task, completions) if callable(getattr(fn, "score_group", None))
                   else [self._sample_term(term, fn, task, c) for c in completions] for term, fn in self._fns]
        return [self._combine([column[k] for column in columns]) for k in range(len(completions))]

    def _call_task(self, term: RewardTerm, task: Task) -> Task:
        return replace(task, metadata={**task.metadata, **term.params}) if term.params else task

    def _sample_term(self, term: RewardTerm, fn: Verifier, task: Task, completion: str) -> _TermOutcome:
        try:
            return term, _checked(fn(self._call_task(term, task), completion)), None
        except Exception as exc:
            return term, None, self._failed(term, task, completion, exc)

    def _group_term(self, term: RewardTerm, fn: Any, task: Task, completions: Sequence[str]) -> list[_TermOutcome]:
        try:
            results = fn.score_group(self._call_task(term, task), list(completions))
            if not isinstance(results, list) or len(results) != len(completions):
                raise TypeError(f"score_group returned {type(results).__name__} of "
                                f"{len(results) if isinstance(results, list) else '?'} results for "
                                f"{len(completions)} completions")
            return [(term, _checked(r), None) for r in results]
        except Exception as exc:
            error = self._failed(term, task, completions[0] if completions else "", exc, len(completions))
            return [(term, None, error)] * len(completions)

    def _combine(self, outcomes: list[_TermOutcome]) -> CompositeRewardResult:
        """The weighted sum of one completion's term outcomes (a failed term counts 0)."""
        values: dict[str, float] = {}
        errors: dict[str, str] = {}
        stats: dict[str, dict[str, float]] = {}
        total, primary = 0.0, None
        for term, result, error in outcomes:
            if result is None:
                errors[term.name], values[term.name] = error or "", 0.0
                continue
            values[term.name] = float(result.reward)
            total += term.weight * float(result.reward)
            if getattr(result, "stats", None):
                stats[term.name] = dict(result.stats)  # type: ignore[attr-defined]
            if term is self.primary:
                primary = result
        return CompositeRewardResult(
            total, primary.correct if primary else False, primary.answer if primary else None,
            terms=values, errors=errors, stats=stats,
        )

    def _failed(self, term: RewardTerm, task: Task, completion: str, exc: Exception, group: int = 0) -> str:
        self.error_counts[term.name] += max(group, 1)
        error = f"{type(exc).__name__}: {exc}"
        where = f" (a group of {group} completions; the first)" if group else ""
        message = (f"reward term {term.name!r} failed on task {task.id!r}: {error}; "
                   f"completion{where}: {completion[:_SAMPLE_CHARS]!r}")
        if self.on_error == "raise":
            raise RewardTermError(message + " (set reward.on_error: zero to score such samples 0)") from exc
        if term.name in self._warned:
            log.debug(message)
        else:
            self._warned.add(term.name)
            log.warning(message + " (scored 0; later errors of this term are counted, not warned)")
        return error


_TermOutcome = tuple[RewardTerm, RewardResult | None, str | None]


def _checked(result: Any) -> RewardResult:
    """``result`` if it is a RewardResult with a finite reward; TypeError / ValueError otherwise."""
    if not isinstance(result, RewardResult):
        raise TypeError(f"returned {type(result).__name__}, not a RewardResult")
    value = float(result.reward)
    if not math.isfinite(value):
        raise ValueError(f"returned a non-finite reward {value}")
    return result


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
    metrics.update(judge_metrics(r.stats for r in results if isinstance(r, CompositeRewardResult)))
    return metrics


def judge_metrics(samples: Iterable[Mapping[str, Mapping[str, float]]]) -> dict[str, float]:
    """``reward/judge/<term>/swap_consistency`` = sum of ``agreed`` / sum of ``pairs`` over the samples'
    per-term ``stats`` (a pairwise judge with ``swap``: the fraction of pairs whose two orders agreed;
    each pair counts once per sample in it, so twice, which leaves the ratio unchanged)."""
    pairs: dict[str, float] = {}
    agreed: dict[str, float] = {}
    for stats in samples:
        for name, counters in stats.items():
            if "pairs" in counters and "agreed" in counters:
                pairs[name] = pairs.get(name, 0.0) + counters["pairs"]
                agreed[name] = agreed.get(name, 0.0) + counters["agreed"]
    return {f"reward/judge/{name}/swap_consistency": agreed[name] / n for name, n in pairs.items() if n > 0}


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
