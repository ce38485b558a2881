"""A reward-model recipe (``reinforge rm``): the base model, the pairs, the loss, training and output,
validated by pydantic with errors that name the dotted field. Shipped recipes live in
``reinforge/recipes/rm/``; any YAML file with these sections works too."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator

from reinforge.config.base import Part, PartRef, _Strict
from reinforge.config.recipes import RECIPES_DIR, _format_validation_error, apply_overrides
from reinforge.config.task import ArithmeticTaskConfig
from reinforge.errors import ConfigError

RM_RECIPES_DIR = RECIPES_DIR / "rm"


def _check_template(value: str | None) -> str | None:
    if value is not None:
        if "{answer}" not in value:
            raise ValueError("must contain {answer}, where the reference answer goes")
        try:
            value.format(answer="")
        except (IndexError, KeyError, ValueError) as e:
            raise ValueError(f"is not a format string with only {{answer}} ({e})") from None
    return value


class RMModelConfig(_Strict):
    path: str = Field("tiny-base", description="where the reward model starts: a causal LM (its transformer is "
                      "kept, a fresh score head added), a reward model directory, a run directory or a shipped name")
    kind: Literal["sequence_classifier", "autoregressive"] = Field(
        "sequence_classifier", description="sequence_classifier: a score head at the last token; autoregressive: "
        "GenARM's r = beta * sum_t log pi_r(y_t | x, y_<t), the causal LM's summed log-probabilities of the "
        "completion's tokens (Xu et al. 2024, arXiv:2410.08193; no head, no reference model)")
    beta: float = Field(1.0, gt=0, description="with kind: autoregressive, the beta of r (the scale of the "
                        "Bradley-Terry logit); saved with the model for the scorer")
    heads: int = Field(1, ge=1, description="score heads on one transformer (num_labels); more than 1 is an "
                       "ensemble of heads, each trained on every pair, aggregated when scored")
    device: str = Field("cpu", description="cpu, cuda, cuda:N")
    threads: int = Field(0, ge=0, description="torch CPU threads (0: torch's default)")

    @field_validator("heads")
    @classmethod
    def _one_score(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("kind") == "autoregressive" and value != 1:
            raise ValueError("an autoregressive reward model has one score (its log-likelihood); use ensemble: k "
                             "for several models")
        return value


class PairColumns(_Strict):
    prompt: str = Field("prompt", description="text or chat messages (not needed for conversation rows)")
    chosen: str = Field("chosen", description="the preferred answer: text, or a conversation ending with it")
    rejected: str = Field("rejected", description="the other answer, in the same form")
    margin: str | None = Field(None, description="optional: each pair's margin for the margin loss")
    reference: str | None = Field("reference", description="the reference answer (read with data.reference_template)")


class RMDataConfig(_Strict):
    path: str = Field("task", description="JSONL, CSV or Parquet file or datasets directory of pairs; 'task': "
                      "near-miss pairs from `task` (the reference answer over a wrong number next to it)")
    split: str | None = Field(None, description="split of a datasets directory")
    heldout_path: str | None = Field(None, description="held-out pairs (default: whole prompts split off path)")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="share of path's pairs held out (by prompt)")
    heldout_max: int = Field(500, ge=1, description="at most this many held-out pairs")
    columns: PairColumns = Field(default_factory=PairColumns)
    task: ArithmeticTaskConfig = Field(default_factory=lambda: ArithmeticTaskConfig(kind="arithmetic"),
                                       description="with path: task, the arithmetic task whose splits make the pairs")
    pairs_per_task: int = Field(6, ge=1, le=6, description="with path: task, near misses per task (distinct offsets)")
    _template = field_validator("reference_template")(_check_template)
    reference_template: str | None = Field(
        None, description="a reference-based reward model (Cooper's VerifyRM): this text, with {answer} the reference "
        "answer, is appended to the prompt's last user message in training and, read from the model directory, in "
        "scoring; e.g. ' {answer} '")


class RMTrainConfig(_Strict):
    steps: int = Field(400, ge=1, description="optimizer steps")
    batch_size: int = Field(32, ge=1, description="pairs per step")
    lr: float = Field(3e-4, gt=0)
    head_lr: float | None = Field(None, gt=0, description="learning rate of the score head (default: lr)")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float = Field(1.0, gt=0)
    eval_every: int = Field(100, ge=0, description="held-out pair accuracy every N steps (0: at the end only)")
    time_limit_s: float = Field(0.0, ge=0, description="stop after this many seconds (0: no limit)")
    log_every: int = Field(20, ge=1, description="a console line every N steps")


class RMConfig(_Strict):
    seed: int = Field(0, ge=0)
    name: str | None = Field(None, description="run directory name under output_dir (default: timestamped)")
    output_dir: str = Field("runs", description="where run directories are created")
    model: RMModelConfig = Field(default_factory=RMModelConfig)
    data: RMDataConfig = Field(default_factory=RMDataConfig)
    loss: Annotated[PartRef, Part("rm_loss")] = Field(
        "bradley_terry", validate_default=True, description="the pairwise loss with its options inline, e.g. "
        "{name: bradley_terry, margin: true, center_coef: 0.01}")
    train: RMTrainConfig = Field(default_factory=RMTrainConfig)
    ensemble: int = Field(1, ge=1, description="k > 1: train k reward models (seeds seed..seed+k-1) into members/")
    combine: Literal["ensemble", "warm"] = Field(
        "ensemble", description="with ensemble > 1: ensemble (members scored together through the reward term's "
        "aggregate) or warm (their weights averaged into one model/, Rame et al. 2024)")


def rm_recipe_names() -> list[str]:
    return sorted(p.stem for p in RM_RECIPES_DIR.glob("*.yaml"))


def rm_recipe_path(recipe: str) -> Path:
    """A file path, or the name of a shipped reward-model recipe."""
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    shipped = RM_RECIPES_DIR / f"{recipe}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"reward-model recipe {recipe!r}: no such file, nor a shipped one "
                      f"({', '.join(rm_recipe_names())})")


def rm_config_from_dict(data: dict[str, Any], source: str = "config") -> RMConfig:
    try:
        return RMConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def load_rm_config(recipe: str | None, overrides: list[str] | None = None) -> RMConfig:
    """A recipe (file or shipped name; None: the defaults) and dotted overrides -> config. A relative
    data path in a recipe file is taken relative to the recipe's directory when it exists there."""
    data, source = _recipe_data(recipe)
    return rm_config_from_dict(apply_overrides(data, list(overrides or [])), source)


def _recipe_data(recipe: str | None) -> tuple[dict[str, Any], str]:
    data: dict[str, Any] = {}
    source = "defaults"
    if recipe is not None:
        path = rm_recipe_path(recipe)
        source = str(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        for key in ("path", "heldout_path"):
            value = (data.get("data") or {}).get(key)
            if isinstance(value, str) and value != "task" and (path.parent / value).exists():
                data["data"][key] = str(path.parent / value)
    return data, source


class StepColumns(_Strict):
    prompt: str = Field("prompt", description="text or chat messages")
    completions: str = Field("completions", description="the completion's steps, a list of strings")
    labels: str = Field("labels", description="one label per step: a bool or a number in [0, 1]")


class MCLabelConfig(_Strict):
    """Math-Shepherd's automatic step labels (``data.path: task``): the policy's own continuations."""

    policy: str = Field("tiny-base", description="the model whose completions are cut into steps and continued")
    tasks: int = Field(200, ge=1, description="training tasks labelled (the first of a seeded shuffle)")
    heldout_tasks: int = Field(50, ge=1, description="held-out tasks labelled (from the task's held-out split)")
    samples: int = Field(4, ge=1, description="completions per task")
    rollouts: int = Field(8, ge=1, description="N: continuations from each step's end (the paper: 8)")
    label: Literal["soft", "hard"] = Field("soft", description="soft: the share of continuations that are right; "
                                           "hard: 1 if any is")
    step_split: Literal["newline", "tokens"] = Field("newline", description="where steps end: lines, or every "
                                                     "step_tokens tokens")
    step_tokens: int = Field(1, ge=1, description="tokens per step with step_split: tokens")
    max_steps: int = Field(20, ge=1, description="at most this many steps cut from a completion")
    max_new_tokens: int = Field(8, ge=1, description="the policy's completion length")
    temperature: float = Field(1.0, gt=0)


class PRMDataConfig(_Strict):
    path: str = Field(description="JSONL, CSV or Parquet file or datasets directory of step-labelled rows; 'task': "
                      "labels made from `task` by the policy's Monte Carlo continuations (`mc`, Math-Shepherd)")
    task: ArithmeticTaskConfig = Field(default_factory=lambda: ArithmeticTaskConfig(kind="arithmetic"),
                                       description="with path: task, the task whose problems are labelled")
    mc: MCLabelConfig = Field(default_factory=MCLabelConfig)
    split: str | None = Field(None, description="split of a datasets directory")
    heldout_path: str | None = Field(None, description="held-out rows (default: whole prompts split off path)")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="share of path's rows held out (by prompt)")
    heldout_max: int = Field(500, ge=1, description="at most this many held-out rows")
    columns: StepColumns = Field(default_factory=StepColumns)
    step_separator: str = Field("\n", description="what joins the steps into the completion (as the policy writes "
                                "it); '' for steps cut by tokens, which join with nothing")


class PRMConfig(_Strict):
    """A process-reward-model recipe (``reinforge prm``): a token-classification model scored at each
    step's last token, trained with Math-Shepherd's per-step loss."""

    seed: int = Field(0, ge=0)
    name: str | None = Field(None, description="run directory name under output_dir (default: timestamped)")
    output_dir: str = Field("runs", description="where run directories are created")
    model: RMModelConfig = Field(default_factory=RMModelConfig)
    data: PRMDataConfig
    loss: Annotated[PartRef, Part("prm_loss")] = Field("prm_step_bce", validate_default=True,
                                                     description="the per-step loss")
    train: RMTrainConfig = Field(default_factory=RMTrainConfig)

    @field_validator("model")
    @classmethod
    def _classifier(cls, value: RMModelConfig) -> RMModelConfig:
        if value.kind != "sequence_classifier":
            raise ValueError("kind: a process reward model is a token classifier (sequence_classifier's network)")
        return value


def load_prm_config(recipe: str | None, overrides: list[str] | None = None) -> PRMConfig:
    """As ``load_rm_config``, for a process reward model."""
    data, source = _recipe_data(recipe)
    try:
        return PRMConfig.model_validate(apply_overrides(data, list(overrides or [])))
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None
