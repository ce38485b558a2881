"""Step-labelled completions for process reward models, and where each step ends in the tokens.

A row (TRL's stepwise form) is ``{"prompt": text or messages, "completions": [step, ...],
"labels": [label, ...]}``: the completion is the steps joined by ``step_separator`` and each step has
one label, a bool or a number in [0, 1] (Math-Shepherd's soft label: the share of continuations
from the step that reach the right answer). A label count that differs from the step count (a
label outside the completion), a label outside [0, 1] or an empty step is a ``DataError`` naming
the file and line.

Encoding: the completion is rendered as the reward model renders it
(``rewards.reward_model.reward_text_ids``'s rule) and each step's score is read at the token that
holds the step's last character (the tokenizer's offset mapping).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from reinforge.data.columns import _check_prompt
from reinforge.data.tabular import table_rows
from reinforge.errors import DataError
from reinforge.rewards.prm import encode_steps, step_ends  # noqa: F401  (how a PRM reads a completion)
from reinforge.types import Messages


@dataclass(frozen=True)
class StepExample:
    prompt: str | Messages
    steps: tuple[str, ...]
    labels: tuple[float, ...]
    where: str


def _label(value: Any, k: int, column: str, where: str) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0:
        return float(value)
    raise DataError(f"{where}: column {column!r}, label {k}: a step label is a bool or a number in [0, 1], "
                    f"got {value!r}")


def row_steps(row: dict[str, Any], where: str, columns: Any) -> StepExample:
    """A step-labelled example from one table row (see the module docstring)."""
    for column in (columns.prompt, columns.completions, columns.labels):
        if column not in row or row[column] is None:
            raise DataError(f"{where}: a step-labelled row needs columns {columns.prompt!r}, {columns.completions!r} "
                            f"and {columns.labels!r}; {column!r} is missing (the row has {sorted(row)})")
    prompt = _check_prompt(row[columns.prompt], columns.prompt, where)
    steps, labels = row[columns.completions], row[columns.labels]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise DataError(f"{where}: column {columns.completions!r} must be a non-empty list of step strings")
    if not isinstance(labels, list):
        raise DataError(f"{where}: column {columns.labels!r} must be a list with one label per step")
    if len(labels) != len(steps):
        raise DataError(f"{where}: {len(labels)} labels for {len(steps)} steps: "
                        + ("a step label outside the completion" if len(labels) > len(steps) else "a step without a label")
                        + f" (column {columns.labels!r} must have one label per step of {columns.completions!r})")
    for k, step in enumerate(steps):
        if not step.strip():
            raise DataError(f"{where}: column {columns.completions!r}, step {k} is empty")
    return StepExample(prompt, tuple(steps), tuple(_label(v, k, columns.labels, where) for k, v in enumerate(labels)),
                       where)


def read_steps(path: str, columns: Any, split: str | None = None) -> list[StepExample]:
    examples = [row_steps(row, where, columns) for where, row in table_rows(path, split)]
    if not examples:
        raise DataError(f"{path}: no step-labelled rows")
    return examples


def step_batch(rows: list[tuple[list[int], list[int], list[float]]], pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, step positions, step labels, step mask), right-padded; ``rows`` are
    (ids, step positions, labels)."""
    width = max(len(ids) for ids, _, _ in rows)
    steps = max(len(p) for _, p, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    pos = torch.zeros((len(rows), steps), dtype=torch.long)
    labels = torch.zeros((len(rows), steps))
    step_mask = torch.zeros((len(rows), steps))
    for r, (row_ids, row_pos, row_labels) in enumerate(rows):
        ids[r, : len(row_ids)] = torch.tensor(row_ids)
        mask[r, : len(row_ids)] = 1
        pos[r, : len(row_pos)] = torch.tensor(row_pos)
        labels[r, : len(row_labels)] = torch.tensor(row_labels)
        step_mask[r, : len(row_pos)] = 1
    return ids, mask, pos, labels, step_mask
