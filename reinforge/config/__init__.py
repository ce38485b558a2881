"""Typed run configuration: pydantic models of every section (``base``, ``task``, ``algo``, ``run``) and
YAML recipes with presets and dotted command-line overrides (``recipes``).

    reinforge train recipes/x.yaml algo.policy_loss.clip_high=0.28 train.steps=50

Unknown keys and bad values are rejected before any work starts, with the dotted name of the field
and the allowed values. The fully resolved config is saved in the run directory.
"""

from reinforge.config.algo import AlgoConfig, CriticConfig, KLConfig, MismatchConfig
from reinforge.config.base import (
    GroupSamplerConfig,
    LossTermConfig,
    PartConfig,
    RewardShaperConfig,
    TaskSamplerConfig,
)
from reinforge.config.model import LoraConfig, ModelConfig
from reinforge.config.orchestrate import OrchestrateConfig
from reinforge.config.recipes import (
    DEFAULT_RECIPE,
    PRESETS_DIR,
    RECIPES_DIR,
    apply_overrides,
    config_from_dict,
    deep_merge,
    dump_config,
    load_config,
    load_preset,
    parse_override,
    preset_names,
    preset_path,
    preset_summary,
    resolve_recipe_path,
)
from reinforge.config.run import (
    CheckpointConfig,
    EnvConfig,
    EvalConfig,
    LogConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
)
from reinforge.config.task import (
    TASK_KINDS,
    AgentTaskConfig,
    ArithmeticTaskConfig,
    ColumnsConfig,
    EnvTaskConfig,
    FileTaskConfig,
    JsonlTaskConfig,
    JudgeConfig,
    ReasoningGymTaskConfig,
    RewardConfig,
    RewardModelConfig,
    RewardTermConfig,
    RGTaskItem,
    ShapesTaskConfig,
    TableTaskConfig,
    TaskConfig,
    TaskConfigBase,
    task_config,
    task_kind_model,
)

__all__ = [
    "DEFAULT_RECIPE", "PRESETS_DIR", "RECIPES_DIR", "TASK_KINDS", "AgentTaskConfig", "AlgoConfig",
    "ArithmeticTaskConfig", "CheckpointConfig", "ColumnsConfig", "CriticConfig", "EnvConfig", "EnvTaskConfig", "EvalConfig",
    "FileTaskConfig", "GroupSamplerConfig", "JsonlTaskConfig", "JudgeConfig", "KLConfig", "LogConfig", "LoraConfig",
    "LossTermConfig", "MismatchConfig", "ModelConfig", "OrchestrateConfig", "PartConfig", "RGTaskItem",
    "ReasoningGymTaskConfig", "RewardConfig", "RewardModelConfig", "RewardShaperConfig", "RewardTermConfig", "RolloutConfig", "RunConfig", "ShapesTaskConfig",
    "TableTaskConfig", "TaskConfig", "TaskConfigBase", "TaskSamplerConfig", "TrainConfig", "apply_overrides",
    "config_from_dict", "deep_merge", "dump_config", "load_config", "load_preset", "parse_override", "preset_names",
    "preset_path", "preset_summary", "resolve_recipe_path", "task_config", "task_kind_model",
]
