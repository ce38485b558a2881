"""Built-in procedural task: integer arithmetic ``a+b=`` with an exact answer.

Every problem is an index into the full grid of (operator, a, b); a seeded random subset of
indices is the held-out split and the train split is the rest, so the two never overlap.
The prompt is one user message whose content is ``"{a}{op}{b}="``; the answer is the
decimal result (e.g. ``"46"``). ``metadata["difficulty"]`` is the number of column carries (``+``)
or borrows (``-``, of the larger minus the smaller operand) the problem needs, so evaluation breaks
accuracy down by it (``23+45`` needs 0, ``27+45`` needs 1, ``99+1`` needs 2).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from reinforge.data.base import IndexedSplit, TaskSplits
from reinforge.types import Task

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def column_carries(a: int, b: int, op: str) -> int:
    """Carries of the schoolbook sum ``a + b``, or borrows of ``max(a, b) - min(a, b)`` for ``-``."""
    if op == "-":
        a, b = max(a, b), min(a, b)
    count = carry = 0
    while a or b:
        column = a % 10 + b % 10 + carry if op == "+" else a % 10 - b % 10 - carry
        carry = int(column >= 10) if op == "+" else int(column < 0)
        count += carry
        a, b = a // 10, b // 10
    return count


def arithmetic_problem(index: int, digits: int, ops: str) -> Task:
    """The problem at ``index`` of the grid ops x [0, 10^digits) x [0, 10^digits)."""
    n = 10**digits
    op_index, rest = divmod(index, n * n)
    a, b = divmod(rest, n)
    op = ops[op_index]
    return Task(
        id=f"arith-{index}",
        prompt=[{"role": "user", "content": f"{a}{op}{b}="}],
        answer=str(OPERATORS[op](a, b)),
        metadata={"a": a, "b": b, "op": op, "difficulty": column_carries(a, b, op)},
    )


def arithmetic_splits(digits: int = 2, ops: str = "+", heldout_size: int = 500, seed: int = 1234) -> TaskSplits:
    """Disjoint train / held-out splits of the arithmetic grid (seeded)."""
    if digits < 1 or digits > 3:
        raise ValueError(f"digits must be in 1..3, got {digits}")
    bad = [o for o in ops if o not in OPERATORS]
    if bad or not ops:
        raise ValueError(f"ops must be a non-empty string of {sorted(OPERATORS)}, got {ops!r}")
    total = len(ops) * 10 ** (2 * digits)
    if not 0 < heldout_size < total:
        raise ValueError(f"heldout_size must be in 1..{total - 1}, got {heldout_size}")
    perm = np.random.default_rng(seed).permutation(total)
    heldout = np.sort(perm[:heldout_size])
    train = np.sort(perm[heldout_size:])
    return TaskSplits(
        train=IndexedSplit(train, partial(arithmetic_problem, digits=digits, ops=ops)),
        heldout=IndexedSplit(heldout, partial(arithmetic_problem, digits=digits, ops=ops)),
        name=f"arithmetic(digits={digits}, ops={ops})",
    )
