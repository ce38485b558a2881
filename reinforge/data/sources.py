"""Build the train/held-out splits named by a task config."""

from __future__ import annotations

from collections.abc import Callable

from reinforge.config import TaskConfig
from reinforge.data.arithmetic import arithmetic_splits
from reinforge.data.base import TaskSplits
from reinforge.data.jsonl import jsonl_splits
from reinforge.errors import ConfigError


def _arithmetic(cfg: TaskConfig) -> TaskSplits:
    try:
        return arithmetic_splits(digits=cfg.digits, ops=cfg.ops, heldout_size=cfg.heldout_size, seed=cfg.seed)
    except ValueError as e:
        raise ConfigError(f"task: {e}") from None


def _jsonl(cfg: TaskConfig) -> TaskSplits:
    assert cfg.path is not None  # checked by TaskConfig
    return jsonl_splits(cfg.path, cfg.heldout_path, cfg.heldout_size, cfg.seed, cfg.prompt_key, cfg.answer_key)


TASK_SOURCES: dict[str, Callable[[TaskConfig], TaskSplits]] = {"arithmetic": _arithmetic, "jsonl": _jsonl}


def build_task_splits(cfg: TaskConfig) -> TaskSplits:
    return TASK_SOURCES[cfg.kind](cfg)
