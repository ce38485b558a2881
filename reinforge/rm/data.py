"""Preference pairs for training reward models: read from tables or made from a task, split by prompt.

A row is ``{prompt, chosen, rejected}`` (column names from ``data.columns``), in one of two forms:
- prompt + answers: ``prompt`` is text or chat messages, ``chosen`` and ``rejected`` are answer texts
  (the form ``preferences.path`` reads for DPO);
- conversations (no prompt column needed): ``chosen`` and ``rejected`` are chat message lists that
  share every message but the last, an assistant answer (TRL's conversational form); the shared
  messages are the prompt.
An optional ``margin`` column gives each pair's margin for the Bradley-Terry margin loss, and an
optional ``reference`` column the reference answer a reference-based reward model reads.

``path: task`` makes near-miss pairs from an arithmetic task: the reference answer over the answer
plus one of ``OFFSETS`` (``data.preferences.wrong_answer``), ``pairs_per_task`` different offsets per
task; held-out pairs come from the task's held-out split only.

A bad row (a side missing or empty, the two sides the same, conversations that differ before their
last message, a margin that is not a number) is a ``DataError`` naming its file and line.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from reinforge.data.columns import _check_prompt
from reinforge.data.preferences import OFFSETS
from reinforge.data.tabular import prompt_fingerprint, table_rows
from reinforge.errors import DataError
from reinforge.types import Messages, Task


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: ``chosen`` is preferred to ``rejected`` as answers to ``prompt``."""

    prompt: str | Messages
    chosen: str
    rejected: str
    where: str
    margin: float = 0.0
    reference: str | None = None  # the reference answer, for a reference-based reward model


def _answer(value: Any, column: str, where: str) -> str:
    if value is None:
        raise DataError(f"{where}: column {column!r} is missing a value (a pair needs both sides)")
    if not isinstance(value, str):
        raise DataError(f"{where}: column {column!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise DataError(f"{where}: column {column!r} is empty")
    return value


def _split_conversation(value: Any, column: str, where: str) -> tuple[Messages, str]:
    messages = _check_prompt(value, column, where)
    assert isinstance(messages, list)
    last = messages[-1]
    if last["role"] != "assistant":
        raise DataError(f"{where}: column {column!r}: a conversation must end with the assistant's answer, "
                        f"ends with a {last['role']!r} message")
    return messages[:-1], _answer(last["content"], column, where)


def _margin(row: dict[str, Any], column: str | None, where: str) -> float:
    if column is None or row.get(column) is None:
        return 0.0
    try:
        value = float(row[column])
    except (TypeError, ValueError):
        raise DataError(f"{where}: column {column!r} must be a number, got {row[column]!r}") from None
    if not math.isfinite(value):
        raise DataError(f"{where}: column {column!r} must be finite, got {value}")
    return value


def row_pair(row: dict[str, Any], where: str, columns: Any) -> PreferencePair:
    """A pair from one table row (see the module docstring for the two forms)."""
    for side in (columns.chosen, columns.rejected):
        if side not in row or row[side] is None:
            raise DataError(f"{where}: a preference pair needs columns {columns.chosen!r} and {columns.rejected!r}; "
                            f"{side!r} is missing (the row has {sorted(row)})")
    chosen, rejected = row[columns.chosen], row[columns.rejected]
    if isinstance(chosen, list) or isinstance(rejected, list):
        prompt, chosen_text = _split_conversation(chosen, columns.chosen, where)
        prompt_r, rejected_text = _split_conversation(rejected, columns.rejected, where)
        if prompt != prompt_r:
            raise DataError(f"{where}: the {columns.chosen!r} and {columns.rejected!r} conversations differ before "
                            "their last (assistant) message; a pair compares two answers to one prompt")
    else:
        if columns.prompt not in row:
            raise DataError(f"{where}: column {columns.prompt!r} is missing (answers given as text need a prompt; "
                            f"the row has {sorted(row)})")
        prompt = _check_prompt(row[columns.prompt], columns.prompt, where)
        chosen_text = _answer(chosen, columns.chosen, where)
        rejected_text = _answer(rejected, columns.rejected, where)
    if chosen_text == rejected_text:
        raise DataError(f"{where}: chosen and rejected are the same answer ({chosen_text[:80]!r}); "
                        "a pair must prefer one answer to a different one")
    reference = row.get(columns.reference) if columns.reference else None
    if reference is not None and not isinstance(reference, str):
        reference = str(reference)
    return PreferencePair(prompt, chosen_text, rejected_text, where, _margin(row, columns.margin, where), reference)


def read_pairs(path: str, columns: Any, split: str | None = None) -> list[PreferencePair]:
    """Every row of a JSONL / CSV / Parquet file or ``datasets`` directory as a pair."""
    pairs = [row_pair(row, where, columns) for where, row in table_rows(path, split)]
    if not pairs:
        raise DataError(f"{path}: no preference rows")
    return pairs


def split_by_prompt(pairs: list[PreferencePair], heldout: int, seed: int
                    ) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(train, held-out): whole prompts go to one side, so no held-out prompt is trained on. Prompts
    are shuffled with ``seed`` and taken until at least ``heldout`` pairs are held out."""
    by_prompt: dict[str, list[PreferencePair]] = {}
    for p in pairs:
        by_prompt.setdefault(prompt_fingerprint(p.prompt), []).append(p)
    if len(by_prompt) < 2:
        raise DataError(f"{pairs[0].where}: all {len(pairs)} pairs share one prompt; held-out pairs need "
                        "prompts of their own (give more prompts, or a held-out file)")
    keys = sorted(by_prompt)
    held: list[PreferencePair] = []
    train_keys = []
    for i in np.random.default_rng(seed).permutation(len(keys)):
        if len(held) < heldout:
            held.extend(by_prompt[keys[i]])
        else:
            train_keys.append(keys[i])
    train = [p for k in train_keys for p in by_prompt[k]]
    if not train:
        raise DataError("no training pairs are left after the held-out split; lower data.heldout_fraction")
    return train, held


def near_miss_pairs(tasks: Iterable[Task], pairs_per_task: int) -> list[PreferencePair]:
    """For each task, ``pairs_per_task`` pairs: its reference answer over the answer plus distinct
    offsets from ``OFFSETS``, starting at one picked by a checksum of the task id."""
    if not 1 <= pairs_per_task <= len(OFFSETS):
        raise DataError(f"data.pairs_per_task must be in 1..{len(OFFSETS)}, got {pairs_per_task}")
    out = []
    for task in tasks:
        try:
            value = int(task.answer)
        except ValueError:
            raise DataError(f"task {task.id}: data.path=task makes near misses of whole-number answers, got "
                            f"{task.answer!r}; give a file of pairs instead") from None
        start = zlib.crc32(task.id.encode()) % len(OFFSETS)
        for k in range(pairs_per_task):
            offset = OFFSETS[(start + k) % len(OFFSETS)]
            out.append(PreferencePair(task.prompt, task.answer, str(value + offset), f"task {task.id}",
                                      reference=task.answer))
    return out
