"""Tasks from local tables: JSONL, CSV, Parquet, and Hugging Face ``datasets`` (a directory written
by ``save_to_disk``, or data files read with ``load_dataset``), with the columns named by a
`ColumnsConfig` (``task.columns``; the row -> `Task` mapping is in ``data/columns.py``).

A prompt cell is raw text or a list of ``{"role", "content"}`` chat messages. Every bad row raises
`DataError` naming the file, the line (text formats) or row index (columnar formats), what is wrong,
and the columns the row has.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.data.columns import ColumnsConfig, rows_to_tasks
from reinforge.data.jsonl import iter_jsonl
from reinforge.errors import DataError
from reinforge.types import Messages, Task

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "csv", "parquet", "hf_disk", "hf_files")
_BY_SUFFIX = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet", ".json": "hf_files", ".arrow": "hf_files"}
_HF_BUILDER = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


def _is_glob(path: str | Path) -> bool:
    return any(ch in str(path) for ch in "*?[")


def detect_format(path: str | Path) -> str:
    """The reader for ``path``: a ``save_to_disk`` directory, a glob or .json/.arrow file (read by
    ``datasets.load_dataset``), or .jsonl / .csv / .parquet (read directly)."""
    p = Path(path)
    if _is_glob(path):
        return "hf_files"
    if not p.exists():
        raise DataError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
            return "hf_disk"
        raise DataError(f"{p}: a directory, but not a dataset written by datasets' save_to_disk "
                        "(no dataset_dict.json or state.json); give a file or a glob of data files")
    fmt = _BY_SUFFIX.get(p.suffix.lower())
    if fmt is None:
        raise DataError(f"{p}: unknown file type {p.suffix!r}; give task.format, one of {', '.join(FORMATS)}")
    return fmt


# ---------------------------------------------------------------------------------------------
# Row readers: each yields (where, row) with ``where`` naming the file and line or row.


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    return ((f"{path}:{lineno}", row) for lineno, row in iter_jsonl(path))


_EXTRA = "\0extra"


def _csv_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f, restkey=_EXTRA)
        header = reader.fieldnames or []
        last = reader.line_num
        for row in reader:
            where, last = f"{path}:{last + 1}", reader.line_num
            if _EXTRA in row:
                raise DataError(f"{where}: {len(header) + len(row[_EXTRA])} fields, but the header has "
                                f"{len(header)} (columns: {header})")
            short = [k for k, v in row.items() if v is None]
            if short:
                raise DataError(f"{where}: fewer fields than the header: no value for column {short[0]!r} "
                                f"(columns: {header})")
            yield where, row


def _parquet_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and others
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    index = 0
    for batch in file.iter_batches():
        for row in batch.to_pylist():
            yield f"{path}: row {index}", row
            index += 1


def _hf_rows(dataset: Any, label: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for index, row in enumerate(dataset):
        yield f"{label}: row {index}", row


def _hf_disk_rows(path: Path, split: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise DataError(f"{path}: cannot load with datasets.load_from_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        names = sorted(ds)
        if split is None and len(names) == 1:
            split = names[0]
        if split is None or split not in ds:
            what = "choose one with task.split" if split is None else f"no split {split!r}"
            raise DataError(f"{path}: a DatasetDict with splits {names}; {what}")
        return _hf_rows(ds[split], f"{path} [{split}]")
    return _hf_rows(ds, str(path))


def _hf_files_rows(path: Path, cache_dir: str | Path | None) -> Iterator[tuple[str, dict[str, Any]]]:
    import datasets

    builder = _HF_BUILDER.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: datasets.load_dataset reads {sorted(_HF_BUILDER)} data files, not {path.suffix!r}")
    try:
        ds = datasets.load_dataset(builder, data_files=str(path), split="train",
                                   cache_dir=None if cache_dir is None else str(cache_dir))
    except Exception as e:  # datasets wraps parse errors in several exception types
        raise DataError(f"{path}: datasets.load_dataset({builder!r}) failed: {e}") from None
    return _hf_rows(ds, str(path))


def _rows(path: Path, fmt: str, split: str | None, cache_dir: str | Path | None):
    if not _is_glob(path) and not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if fmt == "hf_files":
        return _hf_files_rows(path, cache_dir)
    if fmt == "hf_disk":
        return _hf_disk_rows(path, split)
    if not path.is_file():
        raise DataError(f"{path}: not a file (format {fmt})")
    return {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}[fmt](path)


def table_rows(path: str | Path, split: str | None = None,
               cache_dir: str | Path | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, row) for every row of a local table in any of ``FORMATS``; ``where`` names the file and
    the line or row index, for errors."""
    return _rows(Path(path), detect_format(path), split, cache_dir)


def read_table_tasks(
    path: str | Path,
    columns: ColumnsConfig | None = None,
    *,
    format: str | None = None,
    split: str | None = None,
    json_columns: tuple[str, ...] = (),
    as_chat: bool = False,
    cache_dir: str | Path | None = None,
) -> list[Task]:
    """Read every row of a table as a `Task`.

    ``format``: one of `FORMATS` (default: from the path, see `detect_format`). ``split``: the split of
    a saved ``DatasetDict`` (optional when it has one). ``json_columns``: string cells of these columns
    are decoded as JSON first (CSV cells are always strings: chat prompts or test lists in a CSV are
    JSON text). ``as_chat``: wrap raw-text prompts in one user message, so the tokenizer's chat
    template (and ``task.system_prompt``) applies. ``cache_dir``: the ``datasets`` cache for
    ``hf_files``. Raises `DataError` naming the file and line/row on the first bad row.
    """
    fmt = format or detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"{path}: unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    p = Path(path)
    stem = p.stem if p.suffix else p.name
    rows = ((where, f"{stem}:{index}", row) for index, (where, row) in enumerate(_rows(p, fmt, split, cache_dir)))
    return rows_to_tasks(rows, columns, str(path), json_columns, as_chat, p.parent if p.is_file() else p)


# ---------------------------------------------------------------------------------------------
# Train / held-out splits.


def prompt_fingerprint(prompt: str | Messages) -> str:
    """A hash of what the model is asked: the non-system messages' roles and contents, with runs of
    whitespace collapsed; raw text counts as one user message (so ``"Q"`` and ``[{"role": "user",
    "content": "Q"}]`` are the same prompt)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    canon = [[m["role"], " ".join(m["content"].split())] for m in messages if m["role"] != "system"]
    return hashlib.sha256(json.dumps(canon, ensure_ascii=False).encode()).hexdigest()


def pictures_fingerprint(images: tuple) -> str:
    """A hash of a task's pictures ("" for none): the same question about two pictures is two prompts."""
    if not images:
        return ""
    digest = hashlib.sha256()
    for image in images:
        digest.update(f"{image.mode}:{image.size}:".encode())
        digest.update(image.tobytes())
    return ":" + digest.hexdigest()


def _split_by_prompt(tasks: list[Task], heldout_size: int, seed: int) -> tuple[list[Task], list[Task]]:
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        groups.setdefault(prompt_fingerprint(t.prompt) + pictures_fingerprint(t.images), []).append(i)
    order = sorted(groups, key=lambda fp: hashlib.sha256(f"{seed}:{fp}".encode()).hexdigest())
    held: set[int] = set()
    for fp in order:
        if len(held) == heldout_size:
            break
        if len(held) + len(groups[fp]) <= heldout_size:
            held.update(groups[fp])
    return [t for i, t in enumerate(tasks) if i not in held], [t for i, t in enumerate(tasks) if i in held]


def table_splits(
    train_path: str | Path,
    heldout_path: str | Path | None = None,
    heldout_size: int | Callable[[int], int] = 0,
    seed: int = 1234,
    columns: ColumnsConfig | None = None,
    *,
    format: str | None = None,
    split: str | None = None,
    heldout_split: str | None = None,
    json_columns: tuple[str, ...] = (),
    as_chat: bool = False,
    cache_dir: str | Path | None = None,
) -> TaskSplits:
    """Disjoint train / held-out splits of a table; both keep file order.

    The split is by prompt content, never by row: rows whose prompts have the same
    `prompt_fingerprint` (duplicates, up to whitespace and system messages) and the same pictures
    (`pictures_fingerprint`) always land on the same side.

    - With ``heldout_path`` (and ``heldout_split``, default ``split``, for a saved ``DatasetDict``):
      the held-out tasks are that table's rows, and training rows whose prompt also appears there
      are dropped (logged as a warning).
    - Without it: prompts are ordered by a hash of ``(seed, prompt)`` and whole groups of equal
      prompts are taken into the held-out split in that order until it holds ``heldout_size`` rows
      (a group that would overflow it is skipped). The result depends only on the seed and the set
      of rows, not on their order in the file.
    """
    read = dict(columns=columns, format=format, json_columns=json_columns, as_chat=as_chat, cache_dir=cache_dir)
    tasks = read_table_tasks(train_path, split=split, **read)
    if heldout_path is not None:
        heldout = read_table_tasks(heldout_path, split=heldout_split or split, **read)
        seen = {prompt_fingerprint(t.prompt) for t in heldout}
        train = [t for t in tasks if prompt_fingerprint(t.prompt) not in seen]
        if len(train) < len(tasks):
            log.warning("%s: dropped %d training rows whose prompt is also in the held-out set %s",
                        train_path, len(tasks) - len(train), heldout_path)
    else:
        heldout_size = heldout_size(len(tasks)) if callable(heldout_size) else heldout_size
        if not 0 <= heldout_size < len(tasks):
            raise DataError(f"{train_path}: task.heldout_size={heldout_size} must be in 0..{len(tasks) - 1} "
                            f"({len(tasks)} rows); lower it, or leave it unset (task.heldout_fraction of the rows)")
        train, heldout = _split_by_prompt(tasks, heldout_size, seed)
    if not train:
        raise DataError(f"{train_path}: no training rows left after taking the held-out split")
    return TaskSplits(train, heldout, name=str(train_path))
