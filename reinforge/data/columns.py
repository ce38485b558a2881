"""Which columns of a dataset row hold what (``task.columns``), and one row -> one `Task`.

The one column mapping of every file-based task source (``task.kind`` ``jsonl`` and ``table``):
`ColumnsConfig` is the recipe's ``task.columns`` section (a config model, ``config/task.py``), and
`rows_to_tasks` applies it to the rows a reader yields. Every bad row raises `DataError` naming where it is (file and line, or row
index), what is wrong, and the columns the row has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reinforge.config.columns import ColumnsConfig
from reinforge.errors import DataError
from reinforge.types import Messages, Task

ROLES = ("system", "user", "assistant", "tool")


def _cell(row: dict[str, Any], column: str, where: str, json_columns: tuple[str, ...]) -> Any:
    if column not in row:
        raise DataError(f"{where}: missing column {column!r} (columns: {sorted(row)})")
    value = row[column]
    if column in json_columns and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: column {column!r} is not valid JSON ({e.msg} at column {e.colno})") from None
    return value


def _check_prompt(value: Any, column: str, where: str) -> str | Messages:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: column {column!r} is empty")
        return value
    if value is None:
        raise DataError(f"{where}: column {column!r} is null")
    if not isinstance(value, list | tuple) or not value:
        raise DataError(f"{where}: column {column!r} must be a string or a non-empty list of "
                        f"{{'role': ..., 'content': ...}} messages, got {type(value).__name__}")
    messages: Messages = []
    for i, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and (isinstance(m.get("content"), str) or _parts(m.get("content")))):
            raise DataError(f"{where}: column {column!r}, message {i}: expected {{'role': str, 'content': str}} (or "
                            f"content as a list of text and image_url parts), got {str(m)[:80]}")
        if m["role"] not in ROLES:
            raise DataError(f"{where}: column {column!r}, message {i}: unknown role {m['role']!r} "
                            f"(allowed: {', '.join(ROLES)})")
        messages.append({"role": m["role"], "content": m["content"]})
    return messages


def _parts(content: Any) -> bool:
    """OpenAI content parts: a non-empty list of ``{"type": "text", "text": str}`` and ``{"type": "image_url",
    "image_url": {"url": ...}}`` parts."""
    return isinstance(content, list) and bool(content) and all(
        isinstance(p, dict) and ((p.get("type") == "text" and isinstance(p.get("text"), str))
                                 or p.get("type") == "image_url") for p in content)


def _prompt_pictures(prompt: str | Messages, column: str, where: str, base_dir: Path | None
                     ) -> tuple[str | Messages, tuple[Any, ...]]:
    """The prompt with its messages' ``image_url`` parts (data URLs, or paths relative to ``base_dir``) read
    into pictures and left as image placeholders (rollout/vision.py); text-only part lists become strings."""
    from reinforge.errors import ConfigError
    from reinforge.rollout.vision import split_image_parts

    if isinstance(prompt, str):
        return prompt, ()
    try:
        messages, pictures = split_image_parts(prompt, f"{where}: column {column!r}, ", base_dir)
    except ConfigError as e:
        raise DataError(str(e)) from None
    if not pictures:  # text parts only: the plain string content text models' templates expect
        messages = [{**m, "content": "".join(p["text"] for p in m["content"])} if isinstance(m["content"], list)
                    else m for m in messages]
    return messages, pictures


def _tests_metadata(value: Any, column: str, where: str) -> dict[str, Any]:
    if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        return {"asserts": value}
    if isinstance(value, list) and value and all(isinstance(v, dict) and {"input", "output"} <= v.keys()
                                                 for v in value):
        return {"io": value}
    if isinstance(value, dict) and value and set(value) <= {"asserts", "io"}:
        return dict(value)
    raise DataError(f"{where}: column {column!r} must hold tests: a string or list of assert strings, a list of "
                    f"{{'input', 'output'}} objects, or an object with 'asserts'/'io'; got {str(value)[:80]}")


def _with_system(prompt: str | Messages, system: Any, cols: ColumnsConfig, where: str) -> Messages:
    if not isinstance(system, str):
        raise DataError(f"{where}: column {cols.system!r} (system prompt) must be a string, got {type(system).__name__}")
    if isinstance(prompt, list) and prompt[0]["role"] == "system":
        raise DataError(f"{where}: both a system column {cols.system!r} and a system message in {cols.prompt!r}")
    user = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return [{"role": "system", "content": system}, *user]


def _images(value: Any, column: str, where: str, base_dir: Path | None) -> tuple[Any, ...]:
    """A cell of the images column as RGB pictures: one picture or a list (a path relative to ``base_dir``,
    bytes, a PIL image, or an HF ``datasets`` ``Image`` cell ``{"bytes", "path"}``); a bad one names the row."""
    from reinforge.errors import ConfigError
    from reinforge.rollout.vision import read_image

    cells = list(value) if isinstance(value, list | tuple) else [value]
    if value is None or not cells:
        raise DataError(f"{where}: column {column!r} (images) is empty")
    out = []
    for i, cell in enumerate(cells):
        if isinstance(cell, dict):  # datasets' Image feature, not decoded
            cell = cell.get("bytes") or cell.get("path")
        try:
            out.append(read_image(cell, f"{where}: column {column!r}" + (f", image {i}" if len(cells) > 1 else ""),
                                  base_dir))
        except ConfigError as e:
            raise DataError(str(e)) from None
    return tuple(out)


def row_task(row: dict[str, Any], where: str, default_id: str, cols: ColumnsConfig,
             json_columns: tuple[str, ...] = (), as_chat: bool = False, base_dir: Path | None = None) -> Task:
    """One row as a `Task` (``default_id`` unless ``cols.id`` names an id column). ``json_columns``:
    string cells of these columns are decoded as JSON first; ``as_chat``: a raw-text prompt becomes
    one user message; ``base_dir``: where the images column's relative paths start."""
    def cell(column: str) -> Any:
        return _cell(row, column, where, json_columns)

    prompt, images = _prompt_pictures(_check_prompt(cell(cols.prompt), cols.prompt, where), cols.prompt, where, base_dir)
    if as_chat and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if cols.system is not None and (system := cell(cols.system)):
        prompt = _with_system(prompt, system, cols, where)
    answer = ""
    if cols.answer is not None:
        value = cell(cols.answer)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{where}: column {cols.answer!r} (answer) is empty; "
                            "map answer to null if the verifier needs none")
        answer = str(value)
    task_id = default_id
    if cols.id is not None:
        if (value := cell(cols.id)) is None or str(value) == "":
            raise DataError(f"{where}: column {cols.id!r} (id) is empty")
        task_id = str(value)
    meta: dict[str, Any] = {}
    if cols.tests is not None:
        meta.update(_tests_metadata(cell(cols.tests), cols.tests, where))
    for key in ("difficulty", "source"):
        if (column := getattr(cols, key)) is not None:
            meta[key] = cell(column)
    used = set(cols.named().values())
    extra = [c for c in row if c not in used] if cols.metadata is None else cols.metadata
    for column in extra:
        meta[column] = cell(column)
    if cols.images is not None:
        if images:
            raise DataError(f"{where}: pictures both in the prompt's image_url parts and in column {cols.images!r} "
                            "(images): give them in one place")
        images = _images(cell(cols.images), cols.images, where, base_dir)
    return Task(id=task_id, prompt=prompt, answer=answer, metadata=meta, images=images)


def rows_to_tasks(rows: Iterable[tuple[str, str, dict[str, Any]]], cols: ColumnsConfig | None, name: str,
                  json_columns: tuple[str, ...] = (), as_chat: bool = False, base_dir: Path | None = None) -> list[Task]:
    """``(where, default id, row)`` triples -> tasks, with ``cols`` (default: `ColumnsConfig()`).
    A duplicate id (from an id column) and a table without rows (``name`` says which) are errors."""
    cols = cols or ColumnsConfig()
    tasks: list[Task] = []
    first_where: dict[str, str] = {}
    for where, default_id, row in rows:
        task = row_task(row, where, default_id, cols, json_columns, as_chat, base_dir)
        if cols.id is not None:
            if task.id in first_where:
                raise DataError(f"{where}: duplicate id {task.id!r} (first at {first_where[task.id]})")
            first_where[task.id] = where
        tasks.append(task)
    if not tasks:
        raise DataError(f"{name}: the dataset is empty")
    return tasks
