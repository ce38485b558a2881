"""Prompts from a local JSONL file: one JSON object per line, its columns named by ``task.columns``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.data.columns import ColumnsConfig, rows_to_tasks
from reinforge.errors import DataError
from reinforge.types import Task


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a line that is not a JSON object is an error
    naming file:line."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl_tasks(path: str | Path, columns: ColumnsConfig | None = None) -> list[Task]:
    """Read tasks (the columns mapped by ``columns``, `ColumnsConfig`); the default id is
    ``<file name>:<line>``. Errors name file:line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = ((f"{path}:{lineno}", f"{path.name}:{lineno}", row) for lineno, row in iter_jsonl(path))
    return rows_to_tasks(rows, columns, str(path), base_dir=path.parent)


def jsonl_splits(
    path: str | Path,
    heldout_path: str | Path | None = None,
    heldout_size: int | Callable[[int], int] = 0,
    seed: int = 1234,
    columns: ColumnsConfig | None = None,
) -> TaskSplits:
    """Train/held-out from a file (and an optional held-out file, else a seeded split of ``heldout_size``
    rows, or of ``heldout_size(rows)``: e.g. a share of the file)."""
    tasks = read_jsonl_tasks(path, columns)
    if heldout_path is not None:
        return TaskSplits(tasks, read_jsonl_tasks(heldout_path, columns), name=str(path))
    heldout_size = heldout_size(len(tasks)) if callable(heldout_size) else heldout_size
    if heldout_size >= len(tasks):
        raise DataError(f"{path}: task.heldout_size={heldout_size} leaves no training rows ({len(tasks)} rows); "
                        "lower it, or leave it unset (task.heldout_fraction of the rows)")
    perm = np.random.default_rng(seed).permutation(len(tasks))
    heldout = [tasks[i] for i in sorted(perm[:heldout_size])]
    train = [tasks[i] for i in sorted(perm[heldout_size:])]
    return TaskSplits(train, heldout, name=str(path))
