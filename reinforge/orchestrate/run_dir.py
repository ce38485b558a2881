"""The run directory: ``runs/<name>/`` with config.yaml, metrics.jsonl, samples.jsonl, plots, checkpoints."""

from __future__ import annotations

import time
from pathlib import Path

from reinforge.config import RunConfig
from reinforge.errors import ConfigError


def create_run_dir(cfg: RunConfig) -> Path:
    """A new directory for this run: ``cfg.name`` if given (must not exist), else a fresh timestamped name."""
    root = Path(cfg.output_dir)
    if cfg.name:
        path = root / cfg.name
        if path.exists():
            raise ConfigError(
                f"name: run directory {path} already exists; continue it with `reinforge train --resume {path}` "
                "or choose another name"
            )
    else:
        base = f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.task.kind}-{cfg.algo.advantage}"
        path, i = root / base, 1
        while path.exists():
            i += 1
            path = root / f"{base}-{i}"
    path.mkdir(parents=True)
    return path
