"""A classic recipe: ``seed``, ``name``, ``output_dir`` and a ``classic:`` section (environment, agent,
training, evaluation, checkpoints), validated by pydantic with errors that name the dotted field.

Defaults are CleanRL's ``ppo.py`` (Huang et al. 2022, "CleanRL: High-quality Single-file
Implementations of Deep Reinforcement Learning Algorithms", JMLR 23(274)); a recipe writes its own
(``pendulum_ppo``: normalisation wrappers and an update shape for continuous control).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError

from reinforge.classic.envs import EnvConfig
from reinforge.config.base import Part, PartRef, _Strict
from reinforge.config.recipes import RECIPES_DIR, apply_overrides
from reinforge.config.run import CheckpointConfig
from reinforge.errors import ConfigError

CLASSIC_RECIPES_DIR = RECIPES_DIR / "classic"
SECTION = "classic"  # the top-level key that makes a recipe a classic one


class ClassicTrainConfig(_Strict):
    total_env_steps: int = Field(500_000, ge=1, description="environment steps of the run (over all environments)")
    log_every: int = Field(10, ge=1, description="a console line every N updates")
    time_limit_s: float = Field(0.0, ge=0, description="stop after this many seconds (0 = no limit)")
    stop_at_return: float | None = Field(None, description="stop once the mean return of the last "
                                         "`return_window` training episodes reaches it (None = never)")
    return_window: int = Field(20, ge=1, description="episodes in the mean of stop_at_return")
    threads: int = Field(1, ge=1, description="torch threads (small networks: 1 is fastest)")


class ClassicEvalConfig(_Strict):
    episodes: int = Field(10, ge=0, description="episodes of the final evaluation -> eval.json (0 = none)")
    deterministic: bool = Field(True, description="the policy's mode (argmax / the Gaussian's mean) instead of a sample")


class ClassicSection(_Strict):
    agent: Annotated[PartRef, Part("classic_agent")] = Field(
        "ppo", validate_default=True, description="the agent, a registered classic agent with its options inline: "
        "ppo, dqn (`{name: dqn, lr: 1e-3}`; docs/classic.md), sac, impala, rlpd, wsrl; offline td3_bc, cql; "
        "multi-agent ippo, mappo, vdn")
    env: EnvConfig = Field(default_factory=EnvConfig)
    train: ClassicTrainConfig = Field(default_factory=ClassicTrainConfig)
    eval: ClassicEvalConfig = Field(default_factory=ClassicEvalConfig)
    # the LLM run's section (one definition), a step being one update; by default only at the end
    checkpoint: CheckpointConfig = Field(default_factory=lambda: CheckpointConfig(every=0))


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
