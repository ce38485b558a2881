"""Preference pairs for offline DPO (``preferences.path``): a prompt with a chosen and a rejected
answer, as two given rows (``Trajectory.demonstration``) of one group, rewards 1 and 0.

Rows from JSONL, CSV, Parquet or a ``datasets`` directory: ``{"prompt": text or chat messages,
"chosen": text, "rejected": text}`` (column names from ``preferences.columns``); the prompt is
encoded as rollouts encode prompts, each answer followed by the end-of-sequence token. Or
``preferences.path: task``: the run's training tasks, chosen = the reference answer, rejected = a
wrong number next to it (``wrong_answer``; numeric answers only). A bad row is a ``DataError``
naming its file and line.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from reinforge.data.demonstrations import Row, completion_demonstration, demonstration
from reinforge.errors import DataError
from reinforge.types import Task, Trajectory

OFFSETS = (1, -1, 10, -10, 2, -2)


def wrong_answer(answer: str, key: str) -> str:
    """A wrong answer close to a numeric ``answer``: the answer plus an offset picked from ``OFFSETS``
    by a checksum of ``key`` (the same task always gets the same one)."""
    try:
        value = int(answer)
    except ValueError:
        raise DataError(f"task {key}: preferences.path=task makes a wrong answer next to a whole-number "
                        f"reference answer, got {answer!r}; give a file of pairs instead") from None
    return str(value + OFFSETS[zlib.crc32(key.encode()) % len(OFFSETS)])


def pair(tokenizer, prompt: Any, chosen: str, rejected: str, where: str) -> list[Trajectory]:
    """The two rows of a pair: chosen (reward 1) then rejected (reward 0)."""
    if not isinstance(chosen, str) or not isinstance(rejected, str):
        raise DataError(f"{where}: chosen and rejected must be strings")
    if chosen == rejected:
        raise DataError(f"{where}: chosen and rejected are the same answer")
    rows = []
    for answer, reward in ((chosen, 1.0), (rejected, 0.0)):
        ids, mask = completion_demonstration(tokenizer, prompt, answer, where)
        row = demonstration(ids, mask, where, answer)
        row.reward = reward
        rows.append(row)
    return rows


def rows_to_pairs(rows: Iterable[Row], tokenizer, columns: Any) -> list[list[Trajectory]]:
    """One pair per table row (``columns``: the names of the prompt, chosen and rejected columns)."""
    out = []
    for where, row in rows:
        missing = [c for c in (columns.prompt, columns.chosen, columns.rejected) if c not in row]
        if missing:
            raise DataError(f"{where}: a preference pair needs columns {columns.prompt!r}, {columns.chosen!r} and "
                            f"{columns.rejected!r}; missing {missing} (the row has {sorted(row)})")
        out.append(pair(tokenizer, row[columns.prompt], row[columns.chosen], row[columns.rejected], where))
    if not out:
        raise DataError("preferences.path: no rows")
    return out


def task_pairs(tasks: Sequence[Task], tokenizer, prompt_of: Callable[[Task], Any]) -> list[list[Trajectory]]:
    """Pairs from the tasks: the reference answer over a wrong one (``wrong_answer``)."""
    out = []
    for task in tasks:
        if not task.answer:
            raise DataError(f"task {task.id}: no reference answer to prefer")
        answer = str(task.answer)
        out.append(pair(tokenizer, prompt_of(task), answer, wrong_answer(answer, task.id), f"task {task.id}"))
    return out
