"""Procedural tasks for the code-interpreter environment: integer problems where running code helps.

Each kind is a grid of problems with a short ASCII prompt and an exact integer answer (computed
here in Python, never by the model's sandbox):

- ``prod``: ``"4821*379="``, a 4-digit times a 3-digit number (too big to do "in the head").
- ``sum``: ``"sum 17..342="``, the sum of the integers from ``a`` (1-99) to ``b`` (100-999).
- ``count``: ``"multiples of 7 to 500="``, how many of 1..n (100-999) are multiples of k (3-19).
- ``powmod``: ``"3^57%1000="``, ``a**e % m`` for a in 2-19, e in 10-199, m in 97, 1000, 10007.

Every kind contributes the same number of problems (the smallest kind's grid, ``KIND_SIZE``);
a larger grid is walked with a stride coprime to its size, so its problems spread over the whole
range. Index ``i`` is kind ``kinds[i % K]``; as for the calculator, a seeded random subset of
indices is the held-out split (`reinforge.data.grid.grid_splits`), so splits never overlap.
``metadata`` holds the kind and its numbers (the scripted policies of scripts/build_tiny_agent.py
write their code from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.types import Task

POWMOD_MODULI = (97, 1000, 10007)


def _prod(j: int) -> tuple[str, int, dict[str, Any]]:
    a, b = 1000 + j // 900, 100 + j % 900
    return f"{a}*{b}=", a * b, {"a": a, "b": b}


def _sum(j: int) -> tuple[str, int, dict[str, Any]]:
    a, b = 1 + j // 900, 100 + j % 900
    return f"sum {a}..{b}=", (a + b) * (b - a + 1) // 2, {"a": a, "b": b}


def _count(j: int) -> tuple[str, int, dict[str, Any]]:
    k, n = 3 + j // 900, 100 + j % 900
    return f"multiples of {k} to {n}=", n // k, {"k": k, "n": n}


def _powmod(j: int) -> tuple[str, int, dict[str, Any]]:
    rest, m_index = divmod(j, len(POWMOD_MODULI))
    a, e, m = 2 + rest // 190, 10 + rest % 190, POWMOD_MODULI[m_index]
    return f"{a}^{e}%{m}=", pow(a, e, m), {"a": a, "e": e, "m": m}


CODE_KINDS: dict[str, tuple[Callable[[int], tuple[str, int, dict[str, Any]]], int]] = {
    "prod": (_prod, 9000 * 900),
    "sum": (_sum, 99 * 900),
    "count": (_count, 17 * 900),
    "powmod": (_powmod, 18 * 190 * len(POWMOD_MODULI)),
}
KIND_SIZE = min(size for _, size in CODE_KINDS.values())  # problems per kind (10,260)


def _stride(size: int) -> int:
    """A step coprime to ``size`` near its golden section, so ``j * stride % size`` visits the grid evenly."""
    return next(s for s in range(int(size * 0.618), size) if math.gcd(s, size) == 1)


def code_task(index: int, kinds: tuple[str, ...]) -> Task:
    """The task at ``index``: kind ``kinds[index % len(kinds)]``, its ``index // len(kinds)``-th problem."""
    kind = kinds[index % len(kinds)]
    make, size = CODE_KINDS[kind]
    prompt, answer, numbers = make((index // len(kinds)) * _stride(size) % size)
    return Task(id=f"code-{kind}-{index}", prompt=[{"role": "user", "content": prompt}], answer=str(answer),
                metadata={"kind": kind, **numbers})


def code_splits(
    kinds: str | list[str] | tuple[str, ...] = ("prod", "sum", "count", "powmod"), heldout_size: int = 200,
    seed: int = 1234,
) -> TaskSplits:
    """Disjoint train / held-out splits of code-interpreter problems of ``kinds`` (names of ``CODE_KINDS``,
    a list or a comma-separated string), ``KIND_SIZE`` problems of each kind (seeded split)."""
    names = tuple(k.strip() for k in kinds.split(",")) if isinstance(kinds, str) else tuple(kinds)
    unknown = [k for k in names if k not in CODE_KINDS]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(f"kinds must be distinct names from {', '.join(CODE_KINDS)}, got {kinds!r}")
    return grid_splits(len(names) * KIND_SIZE, heldout_size, seed, partial(code_task, kinds=names),
                  f"code_interpreter(kinds={','.join(names)})")
