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
    return jsonl_splits(cfg.path, cfg.heldout_path, cfg.heldout_size, cfg.seed, cfg.columns)


def _table(cfg: TaskConfig) -> TaskSplits:
    from reinforge.data.tabular import table_splits

    assert cfg.path is not None  # checked by TaskConfig
    return table_splits(cfg.path, cfg.heldout_path, cfg.heldout_size, cfg.seed, cfg.columns, format=cfg.format,
                        split=cfg.split, heldout_split=cfg.heldout_split, json_columns=tuple(cfg.json_columns),
                        as_chat=cfg.as_chat)


def _reasoning_gym(cfg: TaskConfig) -> TaskSplits:
    from reinforge.data.reasoning_gym import reasoning_gym_splits

    assert cfg.rg_tasks is not None  # checked by TaskConfig
    tasks = cfg.rg_tasks if isinstance(cfg.rg_tasks, str) else [t.model_dump() for t in cfg.rg_tasks]
    return reasoning_gym_splits(tasks, size=cfg.rg_size, seed=cfg.seed, heldout_size=cfg.heldout_size,
                                params=cfg.rg_params or None, chat=cfg.rg_chat, answer_tag=cfg.rg_answer_tag)


def _agent(cfg: TaskConfig) -> TaskSplits:
    from reinforge.data.agent_tasks import AGENT_TASK_SOURCES

    source = AGENT_TASK_SOURCES[cfg.kind]
    try:
        return source(**cfg.params, heldout_size=cfg.heldout_size, seed=cfg.seed)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task.params for task.kind={cfg.kind}: {e}") from None


TASK_SOURCES: dict[str, Callable[[TaskConfig], TaskSplits]] = {
    "arithmetic": _arithmetic, "jsonl": _jsonl, "table": _table, "reasoning_gym": _reasoning_gym,
    "calculator": _agent, "guessing": _agent,
}


def build_task_splits(cfg: TaskConfig) -> TaskSplits:
    return TASK_SOURCES[cfg.kind](cfg)
