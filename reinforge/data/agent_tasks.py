"""Procedural tasks for the built-in agent environments (short ASCII prompts for tiny models).

- ``calculator``: ``"482*37="`` with the exact integer answer, operands with exactly the given
  digit counts (products the tiny model cannot do in its head: use `CalculatorEnv`'s ``calc``).
- ``code_interpreter`` and ``search``: `reinforge.data.code_tasks` and `reinforge.data.search_corpus`.
- ``guessing``: prompt ``"guess 1-32"``, answer the secret (for `GuessingEnv`). With ``repeats=1``
  there is one task per secret and train / held-out never share a secret; with ``repeats=R > 1``
  each secret is R tasks (episodes), so both splits draw secrets uniformly from the whole range and
  the held-out split measures the *strategy* on the same game, not memorised secrets (the prompt
  is the same for every secret, so a policy can only learn a distribution over secrets).

- ``nim``: one game per pile in ``[low, high]`` (``repeats`` each), answer the pile (for `NimEnv`).

As in ``arithmetic.py``, every task is an index into a grid; a seeded random subset of indices
is the held-out split and the rest is train, so the splits never overlap and ids are stable.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import partial

from reinforge.data.base import TaskSplits
from reinforge.data.code_tasks import code_splits
from reinforge.data.grid import MAX_GRID, grid_splits
from reinforge.data.search_corpus import search_splits
from reinforge.types import Task

CALC_OPERATORS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def calculator_task(index: int, digits: tuple[int, int], ops: str) -> Task:
    """The task at ``index`` of the grid ops x a (``digits[0]`` digits) x b (``digits[1]`` digits)."""
    (lo_a, n_a), (lo_b, n_b) = ((10 ** (d - 1), 9 * 10 ** (d - 1)) for d in digits)
    op_index, rest = divmod(index, n_a * n_b)
    i, j = divmod(rest, n_b)
    a, b, op = lo_a + i, lo_b + j, ops[op_index]
    return Task(
        id=f"calc-{index}",
        prompt=[{"role": "user", "content": f"{a}{op}{b}="}],
        answer=str(CALC_OPERATORS[op](a, b)),
        metadata={"a": a, "b": b, "op": op},
    )


def calculator_splits(
    digits: tuple[int, int] = (3, 2), ops: str = "*", heldout_size: int = 200, seed: int = 1234
) -> TaskSplits:
    """Disjoint train / held-out splits of ``a<op>b=`` problems with exact-length operands (seeded)."""
    digits = tuple(digits)  # type: ignore[assignment]
    if len(digits) != 2 or any(isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= 4 for d in digits):
        raise ValueError(f"digits must be two integers in 1..4 (digits of a and of b), got {digits!r}")
    if not ops or any(o not in CALC_OPERATORS for o in ops) or len(set(ops)) != len(ops):
        raise ValueError(f"ops must be a non-empty string of distinct operators from {''.join(CALC_OPERATORS)!r}, got {ops!r}")
    total = len(ops) * 81 * 10 ** (digits[0] + digits[1] - 2)
    if total > MAX_GRID:
        raise ValueError(f"digits={digits} with ops={ops!r} makes {total} problems; at most {MAX_GRID} are supported")
    return grid_splits(total, heldout_size, seed, partial(calculator_task, digits=digits, ops=ops),
                  f"calculator(digits={digits}, ops={ops})")


def guessing_task(index: int, low: int, high: int) -> Task:
    """The task at ``index`` of the grid repeat x secret: secret ``low + index % (high - low + 1)``;
    the id carries the repeat from the second one on (``guess-7``, ``guess-7-r1``, ...)."""
    repeat, offset = divmod(index, high - low + 1)
    secret = low + offset
    return Task(
        id=f"guess-{secret}" if repeat == 0 else f"guess-{secret}-r{repeat}",
        prompt=[{"role": "user", "content": f"guess {low}-{high}"}],
        answer=str(secret),
        metadata={"low": low, "high": high},
    )


def guessing_splits(
    low: int = 1, high: int = 32, heldout_size: int = 8, seed: int = 1234, repeats: int = 1
) -> TaskSplits:
    """``repeats`` tasks per secret in ``[low, high]``, split by task (seeded). ``repeats=1``: train
    and held-out never share a secret; ``repeats > 1``: both splits hold (about) uniform secrets."""
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)) or not 0 <= low < high:
        raise ValueError(f"need integers 0 <= low < high, got low={low!r}, high={high!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    total = (high - low + 1) * repeats
    if total > MAX_GRID:
        raise ValueError(f"[{low}, {high}] x {repeats} repeats makes {total} tasks; at most {MAX_GRID} are supported")
    name = f"guessing({low}-{high})" if repeats == 1 else f"guessing({low}-{high}, repeats={repeats})"
    return grid_splits(total, heldout_size, seed, partial(guessing_task, low=low, high=high), name)


def nim_task(index: int, low: int, high: int) -> Task:
    """The task at ``index`` of the grid repeat x pile: pile ``low + index % (high - low + 1)``."""
    repeat, offset = divmod(index, high - low + 1)
    pile = low + offset
    return Task(id=f"nim-{pile}" if repeat == 0 else f"nim-{pile}-r{repeat}",
                prompt=[{"role": "user", "content": f"nim {pile}"}], answer=str(pile), metadata={"pile": pile})


def nim_splits(low: int = 3, high: int = 8, heldout_size: int = 8, seed: int = 1234, repeats: int = 8) -> TaskSplits:
    """``repeats`` games per pile in ``[low, high]`` (for `NimEnv`, which writes its own prompts), split by task."""
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)) or not 1 <= low <= high:
        raise ValueError(f"need integers 1 <= low <= high, got low={low!r}, high={high!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    total = (high - low + 1) * repeats
    if total > MAX_GRID:
        raise ValueError(f"[{low}, {high}] x {repeats} repeats makes {total} tasks; at most {MAX_GRID} are supported")
    return grid_splits(total, heldout_size, seed, partial(nim_task, low=low, high=high),
                       f"nim({low}-{high}, repeats={repeats})")


AGENT_TASK_SOURCES: dict[str, Callable[..., TaskSplits]] = {
    "calculator": calculator_splits, "guessing": guessing_splits, "code_interpreter": code_splits, "search": search_splits,
    "nim": nim_splits,
}
