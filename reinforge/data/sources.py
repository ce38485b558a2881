"""Build the train/held-out splits named by a task config (one builder per ``task.kind`` model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reinforge.config import (
    AgentTaskConfig,
    ArithmeticTaskConfig,
    EnvConfig,
    EnvTaskConfig,
    JsonlTaskConfig,
    ReasoningGymTaskConfig,
    ShapesTaskConfig,
    TableTaskConfig,
    TaskConfigBase,
)
from reinforge.data.arithmetic import arithmetic_splits
from reinforge.data.base import TaskSplits
from reinforge.data.jsonl import jsonl_splits
from reinforge.errors import ConfigError


def _arithmetic(cfg: ArithmeticTaskConfig) -> TaskSplits:
    try:
        return arithmetic_splits(digits=cfg.digits, ops=cfg.ops, heldout_size=cfg.heldout_size, seed=cfg.seed)
    except ValueError as e:
        raise ConfigError(f"task: {e}") from None


def _jsonl(cfg: JsonlTaskConfig) -> TaskSplits:
    return jsonl_splits(cfg.path, cfg.heldout_path, cfg.heldout_rows, cfg.seed, cfg.columns)


def _table(cfg: TableTaskConfig) -> TaskSplits:
    from reinforge.data.tabular import table_splits

    return table_splits(cfg.path, cfg.heldout_path, cfg.heldout_rows, cfg.seed, cfg.columns, format=cfg.format,
                        split=cfg.split, heldout_split=cfg.heldout_split, json_columns=tuple(cfg.json_columns),
                        as_chat=cfg.as_chat)


def _reasoning_gym(cfg: ReasoningGymTaskConfig) -> TaskSplits:
    from reinforge.data.reasoning_gym import reasoning_gym_splits

    tasks = cfg.rg_tasks if isinstance(cfg.rg_tasks, str) else [t.model_dump() for t in cfg.rg_tasks]
    return reasoning_gym_splits(tasks, size=cfg.rg_size, seed=cfg.seed, heldout_size=cfg.heldout_size,
                                params=cfg.rg_params or None, chat=cfg.rg_chat, answer_tag=cfg.rg_answer_tag)


def _agent(cfg: AgentTaskConfig) -> TaskSplits:
    from reinforge.data.agent_tasks import AGENT_TASK_SOURCES

    source = AGENT_TASK_SOURCES[cfg.kind]
    try:
        return source(**cfg.params, heldout_size=cfg.heldout_size, seed=cfg.seed)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task (kind {cfg.kind}): {e}") from None


def _shapes(cfg: ShapesTaskConfig) -> TaskSplits:
    from reinforge.data.shapes import shapes_splits

    try:
        return shapes_splits(cfg.question, cfg.image_size, heldout_size=cfg.heldout_size, seed=cfg.seed)
    except ValueError as e:
        raise ConfigError(f"task (kind shapes): {e}") from None


TASK_SOURCES: dict[type[TaskConfigBase], Callable[[Any], TaskSplits]] = {
    ArithmeticTaskConfig: _arithmetic, JsonlTaskConfig: _jsonl, TableTaskConfig: _table,
    ReasoningGymTaskConfig: _reasoning_gym, AgentTaskConfig: _agent,
    ShapesTaskConfig: _shapes,
}


def build_task_splits(cfg: TaskConfigBase, env: EnvConfig | None = None) -> TaskSplits:
    """The splits of ``cfg``; ``task.kind=env`` takes the tasks of the environment ``env`` names."""
    if isinstance(cfg, EnvTaskConfig):
        from reinforge.envs.registry import environment_task_splits

        if env is None:
            raise ConfigError("task.kind=env: the tasks come from the run's env section, which is not given here")
        return environment_task_splits(env.name, env.params, cfg.heldout_size, cfg.seed)
    return TASK_SOURCES[type(cfg)](cfg)
