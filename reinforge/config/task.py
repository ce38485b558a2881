"""Where the prompts come from and how completions are scored: ``task`` and ``reward``.

``task`` is a union discriminated by ``task.kind``: one model per task source, the fields they all
have in `TaskConfigBase`. A key that belongs to another kind is refused, naming the kind.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BeforeValidator,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)

from reinforge.config.base import (
    InlineOptions,
    InlineSection,
    Part,
    PartRef,
    StepShaperConfig,
    StepVerifierConfig,
    TaskSamplerConfig,
    _Strict,
)
from reinforge.config.columns import ColumnsConfig


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


def _needs(data: Any, key: str, what: str) -> Any:
    """A ``mode="before"`` check that ``key`` is given (and not empty), with a message saying what it is."""
    if isinstance(data, dict) and not data.get(key):
        raise ValueError(f"task.kind={data.get('kind')} needs task.{key} ({what})")
    return data


class TaskConfigBase(_Strict):
    """What every task source has: the reward's verifier, the held-out split, the prompt sampler."""

    kind: str
    verifier: str = Field("exact_match", description="a registered verifier (reinforge algos lists them), or your own "
                          "function (task, completion) -> RewardResult | float as module:function or file.py:function (a relative file in a recipe is found next to the recipe first)")
    heldout_size: int = Field(500, ge=1)
    seed: int = Field(1234, description="seed of the train/held-out split")
    sampler: TaskSamplerConfig = Field(default_factory=TaskSamplerConfig, description="which prompts a step draws")
    system_prompt: str | None = Field(None, description="one system message put before every chat prompt")

    @field_validator("verifier")
    @classmethod
    def _verifier(cls, v: str) -> str:
        return _check_verifier(v)


class ArithmeticTaskConfig(TaskConfigBase):
    """The built-in ``a+b=`` grid (the default task)."""

    kind: Literal["arithmetic"] = "arithmetic"
    digits: int = Field(2, ge=1, le=3)
    ops: str = "+"


class ShapesTaskConfig(TaskConfigBase):
    """The built-in image task (``data/shapes.py``, docs/vision.md); it needs a vision-language model (tiny-vlm)."""
    kind: Literal["shapes"] = "shapes"
    question: Literal["colour", "count", "shape", "box", "count_colour", "position", "digits", "bars", "geometry"] = Field(
        "colour", description="name the shape's colour, count the dots, name the shape, give the shape's box "
        "x1,y1,x2,y2 (score it with task.verifier=box_iou), count the shapes of the named colour among others, "
        "name the colour at the named place, read the 2-3 digit number, say which bar is taller (left/right), "
        "or give the polygon's number of sides (docs/vision.md)")
    image_size: int = Field(32, ge=16, le=512, description="pictures are image_size x image_size pixels")
    heldout_size: int = Field(200, ge=1)


class FileTaskConfig(TaskConfigBase):
    """Prompts read from files (``jsonl``, ``table``), their columns named by ``columns``."""

    path: str = Field(
        description="data file, directory or glob; a relative path in a recipe file is taken relative to the "
        "recipe's directory when it exists there, else (and on the command line) relative to the working directory"
    )
    heldout_path: str | None = Field(
        None, description="held-out data (default: a split of path); a relative path is found as for path"
    )
    columns: ColumnsConfig = Field(default_factory=ColumnsConfig, description="which columns hold what")
    heldout_size: int | None = Field(  # type: ignore[assignment]
        None, ge=1, description="held-out rows split off path (unset: heldout_fraction of the rows, at most "
        "heldout_max, at least 1), so that a small file trains as it is")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="with heldout_size unset: the held-out share")
    heldout_max: int = Field(500, ge=1, description="with heldout_size unset: the most held-out rows")

    def heldout_rows(self, rows: int) -> int:
        """How many of ``rows`` the held-out split takes (see ``heldout_size``)."""
        if self.heldout_size is not None:
            return self.heldout_size
        return max(1, min(self.heldout_max, round(self.heldout_fraction * rows)))

    @model_validator(mode="before")
    @classmethod
    def _path_given(cls, data: Any) -> Any:
        return _needs(data, "path", "a data file with prompt and answer columns")


class JsonlTaskConfig(FileTaskConfig):
    """One JSON object per line; held-out split: a seeded permutation of the rows."""

    kind: Literal["jsonl"] = "jsonl"


class TableTaskConfig(FileTaskConfig):
    """JSONL, CSV, Parquet, HF datasets; held-out split by prompt content (docs/data.md)."""

    kind: Literal["table"] = "table"
    format: Literal["jsonl", "csv", "parquet", "hf_disk", "hf_files"] | None = Field(
        None, description="default: from the path"
    )
    split: str | None = Field(None, description="split of an HF DatasetDict (train side)")
    heldout_split: str | None = None
    json_columns: list[str] = Field(default_factory=list, description="columns holding JSON text (e.g. CSV chats)")
    as_chat: bool = Field(False, description="wrap raw-text prompts as one user message")


class ReasoningGymTaskConfig(TaskConfigBase):
    """A reasoning-gym task or weighted mixture, generated from the seed (docs/data.md)."""

    kind: Literal["reasoning_gym"] = "reasoning_gym"
    rg_tasks: str | list[RGTaskItem] = Field(
        description="a reasoning-gym task name, or a weighted mixture [{name, weight, params}]"
    )
    rg_size: int = Field(1000, ge=1)
    rg_params: dict[str, Any] = Field(default_factory=dict)
    rg_chat: bool = True
    rg_answer_tag: str | None = "answer"

    @model_validator(mode="before")
    @classmethod
    def _tasks_given(cls, data: Any) -> Any:
        return _needs(data, "rg_tasks", "a task name or a mixture")


class AgentTaskConfig(TaskConfigBase, InlineSection):
    """Procedural tasks played in a multi-turn environment of the same name. The task source's keyword
    arguments are written inline, ``task: {kind: guessing, low: 1, high: 32}`` (calculator: digits, ops;
    guessing: low, high, repeats; nim: low, high, repeats; code_interpreter: kinds; search: countries, corpus_seed, hops,
    relations, names, layout), checked against its signature; ``params`` holds them."""

    kind: Literal["calculator", "guessing", "code_interpreter", "search", "nim"]

    @classmethod
    def inline_options(cls, data: Mapping[str, Any]) -> InlineOptions | None:
        from reinforge.data.agent_tasks import AGENT_TASK_SOURCES

        kind = data.get("kind")
        if kind not in AGENT_TASK_SOURCES:
            return None
        given = {"heldout_size", "seed"}  # passed from the section's own fields
        allowed = [p for p in inspect.signature(AGENT_TASK_SOURCES[kind]).parameters if p not in given]
        return InlineOptions("kind", kind, allowed, unknown=f"not a field of task kind {kind}")

    @property
    def params(self) -> dict[str, Any]:
        """The task source's keyword arguments (its defaults for the others)."""
        return dict(self._options or {})


class EnvTaskConfig(TaskConfigBase):
    """The environment's own tasks, made from ``env`` (envs/registry.py ``environment_task_splits``)."""
    kind: Literal["env"] = "env"


TASK_KINDS: tuple[type[TaskConfigBase], ...] = (
    ArithmeticTaskConfig, JsonlTaskConfig, TableTaskConfig, ReasoningGymTaskConfig, AgentTaskConfig,
    EnvTaskConfig, ShapesTaskConfig,
)
DEFAULT_TASK_KIND = "arithmetic"
REPLACED_KEYS = {"prompt_key": "columns.prompt", "answer_key": "columns.answer"}


def task_kind_model(kind: str) -> type[TaskConfigBase] | None:
    """The model of ``task.kind`` = ``kind`` (None for an unknown kind)."""
    return next((m for m in TASK_KINDS if kind in get_args(m.model_fields["kind"].annotation)), None)


def _task_input(data: Any) -> Any:
    """A task section before validation: no ``kind`` means arithmetic; old column keys are refused, naming the new."""
    if not isinstance(data, dict):
        return data
    old = [k for k in REPLACED_KEYS if k in data]
    if old:
        raise ValueError(f"{', '.join(f'task.{k}' for k in old)}: columns are named under task.columns for every "
                         f"file source: use {', '.join(f'task.{REPLACED_KEYS[k]}' for k in old)} instead")
    return data if "kind" in data else {"kind": DEFAULT_TASK_KIND, **data}


TaskConfig = Annotated[
    ArithmeticTaskConfig | JsonlTaskConfig | TableTaskConfig | ReasoningGymTaskConfig | AgentTaskConfig
    | EnvTaskConfig | ShapesTaskConfig,
    Field(discriminator="kind"),
    BeforeValidator(_task_input),
]
"""The ``task`` section: one model per ``task.kind`` (a field of another kind is an error)."""
_TASK_ADAPTER: TypeAdapter[Any] = TypeAdapter(TaskConfig)


def task_config(data: dict[str, Any]) -> TaskConfigBase:
    """A task section (a mapping, as in a recipe) validated into its kind's model (or pydantic's ValidationError)."""
    return _TASK_ADAPTER.validate_python(data)


class CoEvolveConfig(_Strict):
    """The reward model keeps training on the policy's samples a rule verifier labels (Cooper, rewards/co_evolve.py)."""

    verifier: str = Field(description="the rule verifier that labels the samples (a registered name or "
                          "module:function), e.g. exact_match")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the reward model")
    pairs_per_group: int = Field(1, ge=1, description="(correct, incorrect) pairs drawn per prompt of a batch")
    batch_size: int = Field(16, ge=1, description="pairs per optimizer step")
    seed: int = Field(0, description="seed of the pair draws")


class RewardModelConfig(_Strict):
    path: str = Field(description="HF AutoModelForSequenceClassification directory, or an ensemble directory "
                      "(ensemble.json) written by `reinforge rm`")
    aggregate: Annotated[PartRef, Part("rm_aggregate")] = Field(
        "mean", validate_default=True, description="how several scores (k heads or k members) become one: mean, "
        "min, {name: uwo, coef: 0.5}")
    transform: Annotated[PartRef, Part("rm_transform")] = Field(
        "none", validate_default=True, description="how the score becomes the reward (algo/reward_transforms.py): "
        "none, {name: clip, width: 1.0}, {name: par, k: 1.0} (reference rewards: the task's "
        "metadata.reference_responses, else its answer)")
    batch_size: int = Field(16, ge=1)
    normalise: Literal["none", "running"] = "none"
    max_length: int | None = Field(None, ge=1)
    threshold: float = Field(0.0, description="correct = score > threshold")
    co_evolve: CoEvolveConfig | None = Field(None, description="keep training the reward model during RL (Cooper)")


JUDGE_PLACEHOLDERS = {"pointwise": ("completion",), "group": ("completions",),
                      "pairwise": ("completion_a", "completion_b")}
"""The placeholders a judge rubric must contain, per mode (all may also use {prompt} and {answer})."""
_MODE_ONLY = {"score_pattern": "pointwise", **dict.fromkeys(
    ("verdict_pattern", "swap", "max_pairs", "pair_seed", "concurrency"), "pairwise")}


class JudgeConfig(_Strict):
    """An LLM judge (rewards/judge.py, rewards/judge_group.py): pointwise (one completion per call),
    group (one call scores every sample of a prompt, RULER-style) or pairwise (A-vs-B win rates)."""

    base_url: str = Field(description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    model: str
    mode: Literal["pointwise", "pairwise", "group"] = Field(
        "pointwise", description="pointwise: a score per completion; group: one call scores all samples of a "
        "prompt; pairwise: each sample's win rate against the others of its prompt")
    rubric: str | None = Field(
        None, description="prompt template (default: the mode's); pointwise needs {completion}, group "
        "{completions} (also {n}, {low}, {high}), pairwise {completion_a} and {completion_b}; all may use "
        "{prompt} and {answer}")
    api_key: str = "EMPTY"
    scale: tuple[float, float] = Field((0, 10), description="(low, high) of the judge's scores (pointwise, group)")
    score_pattern: str | None = Field(None, description="pointwise: the regex whose last match is the score")
    verdict_pattern: str | None = Field(None, description="pairwise: the regex whose last match is A, B or tie")
    swap: bool = Field(True, description="pairwise: ask each pair in both orders; disagreeing verdicts are a tie")
    max_pairs: int | None = Field(None, ge=1, description="pairwise: compare at most this many pairs per "
                                  "prompt, drawn with pair_seed (default: all pairs)")
    pair_seed: int = Field(0, description="pairwise: seeds the draw of max_pairs pairs (per task id)")
    concurrency: int = Field(8, ge=1, description="pairwise: judge calls in flight at once for one prompt")
    max_tokens: int = Field(512, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    threshold: float = 0.5

    @field_validator("score_pattern", "verdict_pattern")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a regex: {exc}") from None
        return v

    @field_validator("scale")
    @classmethod
    def _scale(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[1] > v[0]:
            raise ValueError("must be (low, high) with high > low")
        return v

    @model_validator(mode="after")
    def _mode_fields(self) -> JudgeConfig:
        needed = [f"{{{p}}}" for p in JUDGE_PLACEHOLDERS[self.mode] if self.rubric and f"{{{p}}}" not in self.rubric]
        if needed:
            raise ValueError(f"judge.rubric: mode {self.mode} needs {' and '.join(needed)} in the rubric")
        wrong = [f for f, mode in _MODE_ONLY.items() if f in self.model_fields_set and mode != self.mode]
        if wrong:
            raise ValueError(f"judge.{wrong[0]} does not apply to mode {self.mode}")
        return self


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
    step_verifier: StepVerifierConfig | None = Field(
        None, description="process rewards: a step verifier (rewards/steps.py, e.g. arithmetic_steps) whose step "
        "scores, times coef, are per-token rewards (token_rewards) at the steps' ends; single-turn tasks only")
    step_shaping: StepShaperConfig | None = Field(
        None, description="a step-reward shaper (rewards/step_shaping.py: clip, delta, clip_delta) applied to each "
        "completion's step scores before coef; needs step_verifier")

    @model_validator(mode="after")
    def _shaping_needs_steps(self) -> RewardConfig:
        if self.step_shaping is not None and self.step_verifier is None:
            raise ValueError("step_shaping refines the scores of reward.step_verifier; set a step verifier")
        return self


