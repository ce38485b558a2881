"""The tasks of the self-play environments (``task.kind: env``; docs/multi_agent.md), as their registrations in
reinforge/envs/registry.py take them: ``guess_duel`` and ``tictactoe`` games, and ``problem_synthesis``'s task
starts (training) and fixed sums (held out)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.envs.problem_synthesis import OPERATORS, check_task
from reinforge.types import Task


def _game_task(index: int, name: str, metadata: dict[str, Any]) -> Task:
    return Task(id=f"{name}-{index}", prompt=[{"role": "user", "content": name}], answer="",
                metadata={**metadata, "game": index})


def _check_games(games: int) -> None:
    if isinstance(games, bool) or not isinstance(games, int) or games < 2:
        raise ValueError(f"games must be an integer >= 2, got {games!r}")


def duel_tasks(heldout_size: int, seed: int, low: int = 1, high: int = 16, games: int = 256, **_: Any) -> TaskSplits:
    _check_games(games)
    if isinstance(low, bool) or isinstance(high, bool) or not isinstance(low, int) or not isinstance(high, int) \
            or not 0 <= low < high:
        raise ValueError(f"need integers 0 <= low < high, got low={low!r}, high={high!r}")
    return grid_splits(games, heldout_size, seed, partial(_game_task, name=f"duel {low}-{high}",
                                                          metadata={"low": low, "high": high}), f"guess_duel({low}-{high})")


def ttt_tasks(heldout_size: int, seed: int, games: int = 256, **_: Any) -> TaskSplits:
    _check_games(games)
    return grid_splits(games, heldout_size, seed, partial(_game_task, name="ttt", metadata={}), "tictactoe")


def heldout_expressions(size: int, seed: int, ops: str, min_operand: int, max_operand: int, max_value: int) -> list[str]:
    """``size`` distinct fixed tasks ``a<op>b`` (seeded; operands min_operand..max_operand, value in [0, max_value])."""
    rng, out = np.random.default_rng(seed), dict[str, None]()
    for _ in range(100 * size):
        a, b = (int(v) for v in rng.integers(min_operand, max_operand + 1, size=2))
        text = f"{a}{ops[int(rng.integers(len(ops)))]}{b}"
        if check_task(text, ops, max_operand, max_value)[0] is None:
            out[text] = None
        if len(out) == size:
            return list(out)
    raise ValueError(f"could not draw {size} distinct held-out tasks with ops={ops!r}, max_operand={max_operand}")


def synthesis_tasks(heldout_size: int, seed: int, proposals: int = 256, ops: str = "+", min_operand: int = 10,
                     max_operand: int = 99, max_value: int = 200, **_: Any) -> TaskSplits:
    if isinstance(proposals, bool) or not isinstance(proposals, int) or proposals < 1:
        raise ValueError(f"proposals must be an integer >= 1, got {proposals!r}")
    if not ops or set(ops) - set(OPERATORS):
        raise ValueError(f"ops must be operators from {OPERATORS!r}, got {ops!r}")
    if isinstance(min_operand, bool) or not isinstance(min_operand, int) or not 0 <= min_operand <= max_operand:
        raise ValueError(f"need integers 0 <= min_operand <= max_operand, got {min_operand!r}, {max_operand!r}")
    rng = np.random.default_rng([seed, 1])
    prefixes = [f"{int(rng.integers(min_operand, max_operand + 1))}{ops[i % len(ops)]}" for i in range(proposals)]
    train = [Task(id=f"propose-{i}", prompt=[{"role": "user", "content": p}], answer="", metadata={"prefix": p})
             for i, p in enumerate(prefixes)]
    heldout = [Task(id=f"solve-{e}", prompt=[{"role": "user", "content": f"{e}="}], answer="", metadata={"expression": e})
               for e in heldout_expressions(heldout_size, seed, ops, min_operand, max_operand, max_value)]
    return TaskSplits(train=train, heldout=heldout, name=f"problem_synthesis(ops={ops}, max_operand={max_operand})")
