"""The run directory: ``runs/<name>/`` with config.yaml, metrics.jsonl, samples.jsonl, plots, checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

from reinforge.config import RunConfig
from reinforge.errors import ConfigError


def create_run_dir(cfg: RunConfig) -> Path:
    """A new directory for this run: ``cfg.name`` if given (must not exist), else a fresh timestamped name
    (an estimator given as ``module:function`` named by its function)."""
    advantage = str(cfg.algo.advantage).rpartition(":")[2]
    return new_run_dir(Path(cfg.output_dir), cfg.name, f"{cfg.task.kind}-{advantage}", resumable=True)


def new_run_dir(root: Path, name: str | None, stem: str, resumable: bool = False) -> Path:
    """``root/name`` (``name`` must not exist yet: a ``ConfigError`` naming the field), or, without a
    name, ``root/<timestamp>-<stem>`` with ``-2``, ``-3``, ... until it is new. Created."""
    if name:
        path = root / name
        if path.exists():
            again = f"continue it with `reinforge train --resume {path}` or " if resumable else ""
            raise ConfigError(f"name: run directory {path} already exists; {again}choose another name")
    else:
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}"
        path, i = root / base, 1
        while path.exists():
            i += 1
            path = root / f"{base}-{i}"
    path.mkdir(parents=True)
    return path
