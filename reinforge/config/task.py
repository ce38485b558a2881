"""Where the prompts come from and how completions are scored: ``task`` and ``reward``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from reinforge.config.base import TaskSamplerConfig, _Strict
from reinforge.data.columns import ColumnsConfig


class RGTaskItem(_Strict):
    name: str
    weight: float = Field(1.0, gt=0)
    params: dict[str, Any] = Field(default_factory=dict)


def _check_verifier(name: str) -> str:
    import reinforge.rewards  # noqa: F401  (registers every verifier)
    from reinforge.rewards.imported import is_reference, normalise_reference
    from reinforge.rewards.verifiers import VERIFIERS

    if is_reference(name):  # your own function: module:function or path/to/file.py:function
        return normalise_reference(name)
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; allowed: {', '.join(VERIFIERS.names())}, "
                         "or your own function as module:function or path/to/file.py:function")
    return name


REPLACED_KEYS = {"prompt_key": "columns.prompt", "answer_key": "columns.answer"}


class TaskConfig(_Strict):
    kind: Literal["arithmetic", "jsonl", "table", "reasoning_gym", "calculator", "guessing"] = "arithmetic"
    verifier: str = Field("exact_match", description="a registered verifier (reinforge algos lists them), or your "
                          "own function (task, completion) -> RewardResult | float as module:function or file.py:function (a "
                          "relative file in a recipe is found next to the recipe first)")
    heldout_size: int = Field(500, ge=1)
    seed: int = Field(1234, description="seed of the train/held-out split")
    sampler: TaskSamplerConfig = Field(default_factory=TaskSamplerConfig, description="which prompts a step draws")
    # arithmetic
    digits: int = Field(2, ge=1, le=3)
    ops: str = "+"
    # jsonl and table (their columns named by `columns`)
    path: str | None = Field(
        None, description="data file, directory or glob; a relative path in a recipe file is taken relative to the "
        "recipe's directory when it exists there, else (and on the command line) relative to the working directory"
    )
    heldout_path: str | None = Field(
        None, description="held-out data (default: a split of path); a relative path is found as for path"
    )
    system_prompt: str | None = None
    # table (JSONL, CSV, Parquet, HF datasets)
    format: Literal["jsonl", "csv", "parquet", "hf_disk", "hf_files"] | None = Field(
        None, description="default: from the path"
    )
    split: str | None = Field(None, description="split of an HF DatasetDict (train side)")
    heldout_split: str | None = None
    columns: ColumnsConfig = Field(default_factory=ColumnsConfig)
    json_columns: list[str] = Field(default_factory=list, description="columns holding JSON text (e.g. CSV chats)")
    as_chat: bool = Field(False, description="wrap raw-text prompts as one user message")
    # reasoning-gym
    rg_tasks: str | list[RGTaskItem] | None = Field(
        None, description="a reasoning-gym task name, or a weighted mixture [{name, weight, params}]"
    )
    rg_size: int = Field(1000, ge=1)
    rg_params: dict[str, Any] = Field(default_factory=dict)
    rg_chat: bool = True
    rg_answer_tag: str | None = "answer"
    # procedural agent tasks (calculator, guessing): keyword arguments of their task source
    params: dict[str, Any] = Field(default_factory=dict, description="calculator: digits, ops; guessing: low, high, repeats")

    @model_validator(mode="before")
    @classmethod
    def _old_column_keys(cls, data: Any) -> Any:
        old = [k for k in REPLACED_KEYS if isinstance(data, dict) and k in data]
        if old:
            raise ValueError(f"{', '.join(f'task.{k}' for k in old)}: columns are named under task.columns for every "
                             f"file source: use {', '.join(f'task.{REPLACED_KEYS[k]}' for k in old)} instead")
        return data

    @field_validator("verifier")
    @classmethod
    def _verifier(cls, v: str) -> str:
        return _check_verifier(v)

    @model_validator(mode="after")
    def _source_needs(self) -> TaskConfig:
        if self.kind in ("jsonl", "table") and not self.path:
            raise ValueError(f"task.kind={self.kind} needs task.path (a file with prompt and answer columns)")
        if self.kind == "reasoning_gym" and not self.rg_tasks:
            raise ValueError("task.kind=reasoning_gym needs task.rg_tasks (a task name or a mixture)")
        return self


class RewardModelConfig(_Strict):
    path: str = Field(description="HF AutoModelForSequenceClassification directory (scalar head)")
    batch_size: int = Field(16, ge=1)
    normalise: Literal["none", "running"] = "none"
    max_length: int | None = Field(None, ge=1)
    threshold: float = Field(0.0, description="correct = score > threshold")


class JudgeConfig(_Strict):
    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    model: str
    rubric: str = Field(description="prompt template with {completion} (and {prompt}, {answer})")
    api_key: str = "EMPTY"
    scale: tuple[float, float] = (0, 10)
    score_pattern: str | None = None
    max_tokens: int = Field(512, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    threshold: float = 0.5


class RewardTermConfig(_Strict):
    name: str
    weight: float = 1.0
    primary: bool = Field(False, description="this term's `correct` is the sample's (default: the first term)")
    verifier: str | None = None
    params: dict[str, Any] = Field(default_factory=dict, description="laid over task.metadata for this term")
    reward_model: RewardModelConfig | None = None
    judge: JudgeConfig | None = None

    @field_validator("verifier")
    @classmethod
    def _verifier(cls, v: str | None) -> str | None:
        return _check_verifier(v) if v is not None else v

    @model_validator(mode="after")
    def _one_source(self) -> RewardTermConfig:
        if sum(x is not None for x in (self.verifier, self.reward_model, self.judge)) != 1:
            raise ValueError(f"reward term {self.name!r}: give exactly one of verifier, reward_model, judge")
        return self


class RewardConfig(_Strict):
    """Weighted reward terms (each logged per step as reward/term/<name>); empty = task.verifier alone."""

    terms: list[RewardTermConfig] = Field(default_factory=list)
    on_error: Literal["auto", "raise", "zero"] = Field(
        "auto",
        description="a reward call (or term) that raises, times out or returns non-finite: stop the run (raise), "
        "score 0 and count it (zero), or auto = raise during the first step (a broken reward function fails "
        "loudly), zero after it",
    )
    workers: int = Field(2, ge=1, description="verifier workers scoring completions in parallel off the main loop")
    pool: Literal["auto", "thread", "process"] = Field(
        "auto", description="thread: for sandboxed code, reward models, judges; process: for CPU-bound "
        "pure-Python verifiers such as math_verify (needs a picklable verifier); auto: process when the "
        "reward uses math_verify or reasoning_gym (and no reward model or judge), else thread",
    )
    timeout_s: float = Field(60.0, gt=0, description="per-call timeout of one reward computation")


