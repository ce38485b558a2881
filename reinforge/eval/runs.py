"""Runs for `reinforge compare`: run directories, their config and metrics, grouped into algorithms."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from reinforge.errors import ConfigError, DataError
from reinforge.track.jsonl import read_jsonl

DEFAULT_METRIC = "eval/heldout_acc"


@dataclass
class Run:
    """One finished run directory: its resolved config and its metric records (one per step)."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return seed if isinstance(seed, int) else None

    def values(self, metric: str) -> list[float]:
        """The metric's values in step order (non-finite values, stored as strings, become nan)."""
        out = []
        for record in self.records:
            value = record.get(metric)
            if isinstance(value, bool) or value is None:
                continue
            if isinstance(value, int | float):
                out.append(float(value))
            elif isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
                out.append(float(value))
        return out

    def score(self, metric: str = DEFAULT_METRIC, last_k: int = 1) -> float:
        """The mean of the metric's last ``last_k`` recorded values (``last_k=1``: its last value)."""
        if last_k < 1:
            raise ConfigError(f"last_k must be >= 1, got {last_k}")
        values = self.values(metric)
        if not values:
            keys = sorted({k for r in self.records for k in r if k != "step"})
            raise DataError(f"{self.path}: no metric {metric!r} in metrics.jsonl; it has: {', '.join(keys)}")
        tail = values[-last_k:]
        if not all(math.isfinite(v) for v in tail):
            raise DataError(f"{self.path}: metric {metric!r} is not finite in its last {len(tail)} values: {tail}")
        return float(np.mean(tail))


def _run_dirs(path: Path) -> list[Path]:
    """A run directory, or a directory of run directories (e.g. ``runs/``)."""
    if (path / "metrics.jsonl").is_file():
        return [path]
    if path.is_dir():
        children = sorted(p for p in path.iterdir() if (p / "metrics.jsonl").is_file())
        if children:
            return children
    raise DataError(f"{path}: not a run directory (no metrics.jsonl) nor a directory of run directories")


def load_run(path: str | Path) -> Run:
    path = Path(path)
    config_path = path / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    if not isinstance(config, dict):
        raise DataError(f"{config_path}: expected a mapping, got {type(config).__name__}")
    try:
        records = read_jsonl(path / "metrics.jsonl")
    except json.JSONDecodeError as e:
        raise DataError(f"{path / 'metrics.jsonl'}: line {e.lineno}: not JSON ({e.msg})") from None
    return Run(path, config, records)


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Load run directories; a directory without metrics.jsonl stands for the run directories in it."""
    return [load_run(p) for path in paths for p in _run_dirs(Path(path))]


def _config_value(config: Mapping[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _part_name(value: Any) -> Any:
    """A part field's name: it is written as a name or as ``{name: ..., <option>: value}``."""
    return value["name"] if isinstance(value, Mapping) and "name" in value else value


def group_key(run: Run, group_by: str | None = None) -> str:
    """A run's group: the config value at ``group_by`` (dotted; a part's name for a part field), or by
    default the run's ``preset``, else ``algo.advantage+algo.policy_loss``; a classic run's (docs/classic.md)
    ``<agent>/<environment id>``."""
    if group_by is not None:
        try:
            return str(_part_name(_config_value(run.config, group_by)))
        except KeyError:
            raise ConfigError(f"--group-by {group_by}: no such key in {run.path / 'config.yaml'}") from None
    if run.config.get("preset"):
        return str(run.config["preset"])
    if isinstance(run.config.get("classic"), dict):
        try:
            return f"{_part_name(_config_value(run.config, 'classic.agent'))}/{_config_value(run.config, 'classic.env.id')}"
        except KeyError:
            pass
    try:
        parts = [_part_name(_config_value(run.config, f"algo.{key}")) for key in ("advantage", "policy_loss")]
        return "+".join(map(str, parts))
    except KeyError:
        raise ConfigError(
            f"{run.path}: cannot tell its algorithm (no preset nor algo.advantage/algo.policy_loss in "
            "config.yaml); give the groups explicitly as NAME=RUN,RUN"
        ) from None


def _seed_order(runs: list[Run]) -> list[Run]:
    """Runs in seed order (runs without a seed last), then by name: the order seeds were planned."""
    return sorted(runs, key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, r.name))


def group_runs(specs: Sequence[str], group_by: str | None = None) -> dict[str, list[Run]]:
    """Groups from command-line arguments: ``NAME=PATH,PATH`` is an explicit group; any other
    argument is a run directory (or a directory of them) grouped by :func:`group_key`."""
    groups: dict[str, list[Run]] = {}
    for spec in specs:
        if "=" in spec and not Path(spec).exists():
            name, _, paths = spec.partition("=")
            if not name or not paths:
                raise ConfigError(f"{spec!r}: an explicit group looks like NAME=RUN_DIR,RUN_DIR")
            groups.setdefault(name, []).extend(load_runs([p for p in paths.split(",") if p]))
        else:
            for run in load_runs([spec]):
                groups.setdefault(group_key(run, group_by), []).append(run)
    if not groups:
        raise ConfigError("no runs given")
    return {name: _seed_order(runs) for name, runs in groups.items()}
