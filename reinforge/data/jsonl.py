"""Prompts from a local JSONL file: one JSON object per line with a prompt and an answer column."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from reinforge.data.base import Task, TaskSplits
from reinforge.errors import DataError


def read_jsonl_tasks(path: str | Path, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Task]:
    """Read tasks; the prompt is a string or a list of chat messages. Errors name file:line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    tasks: list[Task] = []
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
            for key in (prompt_key, answer_key):
                if key not in row:
                    raise DataError(f"{where}: missing column {key!r} (columns: {sorted(row)})")
            prompt = row[prompt_key]
            if not isinstance(prompt, str | list) or (
                isinstance(prompt, list)
                and not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in prompt)
            ):
                raise DataError(
                    f"{where}: column {prompt_key!r} must be a string or a list of "
                    "{'role': ..., 'content': ...} messages"
                )
            meta = {k: v for k, v in row.items() if k not in (prompt_key, answer_key)}
            tasks.append(Task(id=f"{path.name}:{lineno}", prompt=prompt, answer=str(row[answer_key]), metadata=meta))
    if not tasks:
        raise DataError(f"{path}: the dataset is empty")
    return tasks


def jsonl_splits(
    path: str | Path,
    heldout_path: str | Path | None = None,
    heldout_size: int = 0,
    seed: int = 1234,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
) -> TaskSplits:
    """Train/held-out from a file (and an optional held-out file, else a seeded split of ``heldout_size``)."""
    tasks = read_jsonl_tasks(path, prompt_key, answer_key)
    if heldout_path is not None:
        return TaskSplits(tasks, read_jsonl_tasks(heldout_path, prompt_key, answer_key), name=str(path))
    if heldout_size >= len(tasks):
        raise DataError(f"{path}: heldout_size={heldout_size} leaves no training rows ({len(tasks)} rows)")
    perm = np.random.default_rng(seed).permutation(len(tasks))
    heldout = [tasks[i] for i in sorted(perm[:heldout_size])]
    train = [tasks[i] for i in sorted(perm[heldout_size:])]
    return TaskSplits(train, heldout, name=str(path))
