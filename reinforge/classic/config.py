"""A classic recipe: ``seed``, ``name``, ``output_dir`` and a ``classic:`` section (environment, agent,
training, evaluation, checkpoints), validated by pydantic with errors that name the dotted field.

Defaults are CleanRL's ``ppo.py`` (Huang et al. 2022, "CleanRL: High-quality Single-file
Implementations of Deep Reinforcement Learning Algorithms", JMLR 23(274)); a recipe writes its own
(``pendulum_ppo``: normalisation wrappers and an update shape for continuous control).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from reinforge.config.base import _Strict
from reinforge.config.recipes import RECIPES_DIR, apply_overrides
from reinforge.errors import ConfigError

CLASSIC_RECIPES_DIR = RECIPES_DIR / "classic"
SECTION = "classic"  # the top-level key that makes a recipe a classic one


class EnvConfig(_Strict):
    id: str = Field("CartPole-v1", min_length=1, description="any registered Gymnasium environment id")
    num_envs: int = Field(4, ge=1, description="environments stepped together (Gymnasium's vector API)")
    vectorization: Literal["sync", "async"] = Field("sync", description="sync (one process) or async "
                               "(a process per environment)")
    normalize_obs: bool = Field(False, description="gymnasium.wrappers.NormalizeObservation per environment")
    normalize_reward: bool = Field(False, description="gymnasium.wrappers.NormalizeReward per environment "
                                   "(scales by the std of a discounted return, gamma = ppo.gamma)")
    clip_obs: float = Field(10.0, gt=0, description="clip normalised observations to [-clip_obs, clip_obs]")
    clip_reward: float = Field(10.0, gt=0, description="clip normalised rewards to [-clip_reward, clip_reward]")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make")

    @model_validator(mode="after")
    def _statistics_readable(self) -> EnvConfig:
        if self.normalize_obs and self.vectorization == "async":
            raise ValueError("normalize_obs needs vectorization: sync (the evaluation and the checkpoints read "
                             "the observation statistics from the environments in this process)")
        return self


class PPOConfig(_Strict):
    """PPO's hyper-parameters (CleanRL ppo.py's defaults)."""

    num_steps: int = Field(128, ge=1, description="steps per environment per rollout")
    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate (eps 1e-5)")
    anneal_lr: bool = Field(True, description="decay the learning rate linearly to 0 over the run")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    num_minibatches: int = Field(4, ge=1, description="mini-batches per epoch")
    update_epochs: int = Field(4, ge=1, description="passes over each rollout")
    norm_adv: bool = Field(True, description="whiten the advantages per mini-batch")
    clip_coef: float = Field(0.2, ge=0, description="PPO clip range epsilon")
    clip_vloss: bool = Field(True, description="clip the value loss around the old values (range clip_coef)")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, ge=0, description="value loss coefficient")
    max_grad_norm: float = Field(0.5, gt=0, description="global gradient-norm clip")
    target_kl: float | None = Field(None, gt=0, description="stop the epochs of an update once approx_kl exceeds it")
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1, description="MLP widths (tanh)")


class TrainConfig(_Strict):
    total_env_steps: int = Field(500_000, ge=1, description="environment steps of the run (over all environments)")
    log_every: int = Field(10, ge=1, description="a console line every N updates")
    time_limit_s: float = Field(0.0, ge=0, description="stop after this many seconds (0 = no limit)")
    stop_at_return: float | None = Field(None, description="stop once the mean return of the last "
                                         "`return_window` training episodes reaches it (None = never)")
    return_window: int = Field(20, ge=1, description="episodes in the mean of stop_at_return")
    threads: int = Field(1, ge=1, description="torch threads (small networks: 1 is fastest)")


class EvalConfig(_Strict):
    episodes: int = Field(10, ge=0, description="episodes of the final evaluation -> eval.json (0 = none)")
    deterministic: bool = Field(True, description="the policy's mode (argmax / the Gaussian's mean) instead of a sample")


class CheckpointConfig(_Strict):
    every: int = Field(0, ge=0, description="a checkpoint every N updates (0 = only at the end)")
    keep: int = Field(2, ge=1, description="checkpoints kept")


class ClassicSection(_Strict):
    agent: Literal["ppo"] = Field("ppo", description="the agent (ppo; more to come: docs/classic.md)")
    env: EnvConfig = Field(default_factory=EnvConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _minibatches_fit(self) -> ClassicSection:
        if self.env.num_envs * self.ppo.num_steps < self.ppo.num_minibatches:
            raise ValueError(f"ppo.num_minibatches ({self.ppo.num_minibatches}) exceeds the rollout's "
                             f"env.num_envs * ppo.num_steps = {self.env.num_envs * self.ppo.num_steps} steps")
        return self


class ClassicConfig(_Strict):
    seed: int = Field(0, ge=0, description="seeds the environments, torch and the action sampling")
    name: str | None = Field(None, description="run directory name under output_dir (default: timestamped)")
    output_dir: str = Field("runs", description="where run directories are created")
    classic: ClassicSection = Field(default_factory=ClassicSection)


def _format(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        field = ".".join(map(str, e["loc"])) or "<root>"
        got = "" if e["type"] == "extra_forbidden" or isinstance(e.get("input"), dict) else f" (got {e['input']!r})"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
        lines.append(f"  {field}: {msg}{got}")
    return "\n".join(lines)


def classic_config_from_dict(data: dict[str, Any], source: str = "config") -> ClassicConfig:
    try:
        return ClassicConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(e, source)) from None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return data if isinstance(data, dict) else None


def classic_recipe_path(recipe: str | None) -> Path | None:
    """The recipe file if ``recipe`` is a classic one (a file with a top-level ``classic:`` section, or
    the name of a shipped classic recipe), else None: the LLM ``train`` path takes it."""
    if recipe is None:
        return None
    path = Path(recipe)
    if not path.is_file():
        path = CLASSIC_RECIPES_DIR / f"{recipe.removesuffix('.yaml')}.yaml"
        return path if path.is_file() else None
    data = _read(path) if path.suffix in (".yaml", ".yml") else None
    return path if data is not None and SECTION in data else None


def classic_recipe_names() -> list[str]:
    return sorted(p.stem for p in CLASSIC_RECIPES_DIR.glob("*.yaml"))


def load_classic_config(recipe: str | Path, overrides: list[str] | None = None) -> ClassicConfig:
    """A classic recipe (file or shipped name) and dotted overrides (``classic.ppo.lr=1e-3``) -> config."""
    path = classic_recipe_path(str(recipe))
    if path is None:
        raise ConfigError(f"{recipe!r} is not a classic recipe (shipped: {', '.join(classic_recipe_names())})")
    data = _read(path) or {}
    return classic_config_from_dict(apply_overrides(data, list(overrides or [])), source=str(path))
