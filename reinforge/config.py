"""Typed run configuration: pydantic models, YAML recipes and dotted command-line overrides.

    reinforge train recipes/x.yaml algo.clip_high=0.28 train.steps=50

Unknown keys and bad values are rejected before any work starts, with the dotted name of the
field and the allowed values. The fully resolved config is saved in the run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reinforge.errors import ConfigError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
PRESETS_DIR = RECIPES_DIR / "presets"
DEFAULT_RECIPE = "default"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_registered(kind: str, name: str) -> str:
    from reinforge.parts import all_kinds  # torch import, deferred until a config is built

    registry = all_kinds()[kind]
    if name not in registry:
        raise ValueError(f"unknown {registry.kind} {name!r}; allowed: {', '.join(registry.names())}")
    return name


class PartConfig(_Strict):
    """A registered part named in a recipe with its own settings: ``{name: ..., params: {...}}``; the
    params are validated by the part's declared settings model (``Registry.register(settings=...)``)."""

    KIND: ClassVar[str] = ""
    name: str
    params: dict[str, Any] = Field(default_factory=dict, description="the part's own settings")

    @model_validator(mode="after")
    def _registered_with_valid_settings(self) -> PartConfig:
        _check_registered(self.KIND, self.name)
        self.settings()  # fail now, naming the field
        return self

    def settings(self) -> Any:
        from reinforge.parts import all_kinds

        return all_kinds()[self.KIND].entry(self.name).make_settings(self.params, f"{self.KIND} {self.name} params")


class LossTermConfig(PartConfig):
    """An extra term of the loss: ``coef * agg(term)``, a registered loss term (reinforge algos)."""

    KIND: ClassVar[str] = "loss_term"
    coef: float = Field(1.0, description="the term's coefficient in the loss")


class TaskSamplerConfig(PartConfig):
    """Which training prompts each step draws (a registered task sampler)."""

    KIND: ClassVar[str] = "task_sampler"
    name: str = "uniform"


class GroupSamplerConfig(PartConfig):
    """How the completions of a prompt's group are produced (a registered group sampler)."""

    KIND: ClassVar[str] = "group_sampler"
    name: str = "independent"


class LoraConfig(_Strict):
    """LoRA adapters (via peft) instead of full fine-tuning; docs/lora.md."""

    enabled: bool = Field(False, description="train LoRA adapters; the reference policy is the base (adapters off)")
    r: int = Field(8, ge=1, description="adapter rank")
    alpha: int = Field(16, ge=1, description="scaling numerator: the update is (alpha / r) * B @ A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input (training forward only)")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1,
        description="module names (suffixes) that get adapters, e.g. q_proj, gate_proj, up_proj, down_proj",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="which biases train (peft's bias option)")

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not name.strip() for name in v):
            raise ValueError("module names must be non-empty, e.g. [q_proj, v_proj]")
        return v


class ModelConfig(_Strict):
    path: str = Field("tiny-base", description="HF model directory, or a shipped alias ('tiny-base')")
    dtype: Literal["float32", "bfloat16", "float16", "float64"] = Field(
        "float32", description="weights' dtype; float64 is for exact-arithmetic checks (slow)")
    device: str = Field("cpu", description="torch device for learner and rollout, e.g. 'cpu' or 'cuda'")
    lora: LoraConfig = Field(default_factory=LoraConfig)


class ColumnsConfig(_Strict):
    """Which columns of a table (JSONL, CSV, Parquet, HF dataset) hold what."""

    prompt: str = "prompt"
    answer: str | None = "answer"
    id: str | None = None
    system: str | None = None
    tests: str | None = None
    difficulty: str | None = None
    source: str | None = None
    metadata: list[str] | None = Field(None, description="columns copied into Task.metadata; null = all other columns")


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
    # jsonl and table
    path: str | None = Field(
        None, description="data file, directory or glob; a relative path in a recipe file is taken relative to the "
        "recipe's directory when it exists there, else (and on the command line) relative to the working directory"
    )
    heldout_path: str | None = Field(
        None, description="held-out data (default: a split of path); a relative path is found as for path"
    )
    prompt_key: str = "prompt"
    answer_key: str = "answer"
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


class RolloutConfig(_Strict):
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=1, description="samples per prompt (G)")
    group_sampler: GroupSamplerConfig = Field(default_factory=GroupSamplerConfig,
                                              description="how a group's completions are produced")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = off")
    stop: list[str] = Field(default_factory=list, description="stop strings (the stop string is kept)")
    engine: Literal["torch", "openai"] = Field(
        "torch", description="'torch': the in-process engine; 'openai': any OpenAI-compatible server at server_url"
    )
    server_url: str | None = Field(None, description="base URL of the server for engine=openai, e.g. http://host:8000/v1")
    server_model: str | None = Field(None, description="model name the server expects (default: model.path)")
    sync_weights: bool = Field(True, description="engine=openai: push new weights to the server after each update")
    ignore_eos: bool = Field(False, description="generate exactly max_new_tokens (benchmarks, throughput tests)")

    @model_validator(mode="after")
    def _openai_needs_url(self) -> RolloutConfig:
        if self.engine == "openai" and not self.server_url:
            raise ValueError("rollout.engine=openai needs rollout.server_url (e.g. http://127.0.0.1:8000/v1)")
        return self


class KLConfig(_Strict):
    estimator: str = "k3"
    coef: float = Field(0.0, ge=0, description="initial KL coefficient; 0 disables the KL term (no reference model)")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="'loss': coef * KL added to the loss; 'reward': -coef * KL per token added to the reward"
    )
    target: float = Field(0.0, ge=0, description="target KL of the adaptive controller (0 = fixed coefficient)")
    horizon: int = Field(10000, ge=1, description="adaptive controller horizon (Ziegler et al. 2019)")

    @field_validator("estimator")
    @classmethod
    def _registered(cls, v: str) -> str:
        return _check_registered("kl_estimator", v)


class MismatchConfig(_Strict):
    mode: str = Field(
        "none", description="rollout/training mismatch correction, a registered one (none, token_tis, seq_tis, "
        "token_mask, seq_mask, or a plug-in's); the statistics are reported in every mode"
    )
    cap: float = Field(2.0, gt=1, description="truncation cap C (TIS) or masking threshold (ratio outside [1/C, C])")

    @field_validator("mode")
    @classmethod
    def _registered(cls, v: str) -> str:
        return _check_registered("mismatch", v)


class CriticConfig(_Strict):
    path: str | None = Field(None, description="critic initialisation (HF model dir); default: the policy's weights")
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    value_clip: float = Field(0.2, ge=0, description="value-loss clipping range around the old values (0 = off)")
    warmup_steps: int = Field(0, ge=0, description="first N steps train only the critic (the policy is frozen)")


class AlgoConfig(_Strict):
    advantage: str = "grpo"
    scale_by_std: bool = True
    adv_eps: float = Field(1e-6, gt=0)
    policy_loss: str = "ppo_clip"
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    tis_cap: float = Field(0.0, ge=0, description="truncated importance-sampling cap C for policy_loss=reinforce (0 = off)")
    loss_agg: str = "token_mean"
    max_len_norm: float = Field(0.0, ge=0, description="L_max for seq_mean_token_sum_norm; 0 = rollout.max_new_tokens")
    dual_clip: float = Field(0.0, ge=0, description="PPO dual-clip constant c > 1 for A < 0 (0 = off)")
    gamma: float = Field(1.0, ge=0, le=1, description="discount of per-token rewards (gae, returns-to-go)")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = Field(0.0, description="entropy bonus coefficient (loss -= coef * entropy)")
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    skip_equal_reward_groups: bool = Field(True, description="drop groups whose rewards are all equal (zero advantage)")
    dynamic_sampling: bool = Field(
        False, description="DAPO: keep sampling prompts until the batch has prompts_per_step groups with reward spread"
    )
    dynamic_sampling_max_rounds: int = Field(4, ge=1, description="cap on rollout rounds per step (dynamic sampling)")
    overlong_buffer: float = Field(
        0.0, ge=0, lt=1, description="DAPO soft overlong penalty zone as a fraction of max_new_tokens (0 = off)"
    )
    overlong_penalty: float = Field(1.0, ge=0, description="penalty at max length (soft overlong punishment)")
    overlong_filter: bool = Field(False, description="DAPO overlong filtering: no loss on truncated responses")
    loss_terms: list[LossTermConfig] = Field(
        default_factory=list, description="extra loss terms beyond the KL and entropy ones (e.g. a plug-in's)"
    )

    @field_validator("advantage")
    @classmethod
    def _adv(cls, v: str) -> str:
        return _check_registered("advantage", v)

    @field_validator("policy_loss")
    @classmethod
    def _pl(cls, v: str) -> str:
        return _check_registered("policy_loss", v)

    @field_validator("loss_agg")
    @classmethod
    def _agg(cls, v: str) -> str:
        return _check_registered("loss_agg", v)

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip(cls, v: float) -> float:
        if 0 < v <= 1:
            raise ValueError("must be 0 (off) or a constant c > 1 (e.g. 3.0)")
        return v


class TrainConfig(_Strict):
    steps: int = Field(200, ge=1, description="RL steps (rollout batch + updates)")
    lr: float = Field(5e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch over a rollout batch")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch")
    micro_batch_tokens: int = Field(8192, ge=1, description="token budget of one forward/backward")
    shared_prefix: bool = Field(
        True, description="compute each group's shared prompt once in the training forward (Llama/Qwen2; exact)"
    )
    time_limit_s: float = Field(0.0, ge=0, description="stop after this many seconds from the start of the run "
                                "(the evaluations before training included; 0 = no limit)")
    fused_optimizer: bool = Field(
        False, description="torch's fused AdamW kernel (one kernel for all parameters; benchmarks/bench_learner.py)"
    )
    packing: bool = Field(
        False, description="pack sequences end to end in the training forward (no compute on padding); micro-batches "
        "then hold micro_batch_tokens real tokens; replaces shared_prefix (docs/memory.md)"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute each layer's activations in the backward instead of keeping them (less memory, "
        "about one more forward of compute)"
    )
    autocast: Literal["none", "bf16"] = Field(
        "none", description="bf16: run the policy/reference forwards under torch.autocast(bfloat16); log-probs, "
        "losses, weights and optimizer state stay float32"
    )
    offload_reference: bool = Field(
        False, description="keep the frozen reference model on the CPU and bring it to model.device only for its "
        "pass at the start of each update"
    )
    world_size: int = Field(
        1, ge=1, description="data-parallel ranks; > 1 spawns them (or run under torchrun); docs/distributed.md"
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="with world_size > 1: ddp (replicated weights) or fsdp (FSDP2 fully_shard, sharded weights)"
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="torch.distributed backend; auto: nccl when model.device is cuda, else gloo"
    )


class EvalConfig(_Strict):
    every: int = Field(20, ge=0, description="held-out evaluation every N steps (0 = only before and after)")
    max_new_tokens: int | None = Field(None, description="default: rollout.max_new_tokens")
    final_samples: int = Field(
        0, ge=0, description="before and after training: mean@n, pass@k, maj@k with n samples (eval.json, passk.png)"
    )
    final_temperature: float = Field(1.0, gt=0)


class CheckpointConfig(_Strict):
    every: int = Field(100, ge=0, description="checkpoint every N steps (0 = only at the end)")
    keep: int = Field(2, ge=1, description="keep the last K checkpoints")


class LogConfig(_Strict):
    samples_per_step: int = Field(4, ge=0, description="completions written to samples.jsonl per step")
    console_every: int = Field(10, ge=1, description="print a metrics line every N steps when not on a terminal")
    sinks: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, description="metric sinks beside metrics.jsonl (always written): tensorboard, "
        "wandb (offline), mlflow (sqlite); docs/tracking.md")
    report: bool = Field(True, description="write report.html (plots, samples, evaluation, config) at the end")


class EnvConfig(_Strict):
    """The environment an episode runs in: ``single_turn`` (one completion scored by the reward) or a
    multi-turn environment (reinforge/envs/registry.py), with the episode limits."""

    name: str = Field("single_turn", description="single_turn, calculator, guessing, retry (reinforge/envs)")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the environment")
    max_turns: int = Field(4, ge=1, description="model turns per episode")
    max_total_tokens: int = Field(0, ge=0, description="whole episode incl. prompt; 0 = the model's context")
    max_turn_tokens: int = Field(0, ge=0, description="tokens per model turn; 0 = rollout.max_new_tokens")
    agent: str | None = Field(None, description="env.name=agent: 'module:function' taking (base_url, task) and "
                              "returning the episode's reward (or posting it to the proxy)")
    agent_workers: int = Field(8, ge=1, description="env.name=agent: agent episodes run concurrently")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        return _check_registered("env", v)

    @model_validator(mode="after")
    def _agent_spec(self) -> EnvConfig:
        from reinforge.envs.registry import environment_spec

        if environment_spec(self.name).agent_driven != (self.agent is not None):
            raise ValueError("env.agent ('module:function') goes with env.name=agent, and env.name=agent needs it")
        return self

    @property
    def multi_turn(self) -> bool:
        from reinforge.envs.registry import environment_spec

        return environment_spec(self.name).multi_turn


class OrchestrateConfig(_Strict):
    """Synchronous or asynchronous RL (docs/async.md)."""

    mode: Literal["sync", "async"] = Field("sync", description="async: rollout runs in its own worker process(es)")
    backend: Literal["local", "ray"] = Field("local", description="local: worker processes on this machine; ray: actors")
    max_staleness: int = Field(1, ge=0, description="async: a batch may be sampled by weights at most this many "
                               "updates older than the learner's (0 = synchronous through the same code path)")
    weight_update: Literal["inflight", "wait"] = Field(
        "inflight", description="inflight: workers take new weights between decode steps; wait: between requests"
    )
    rollout_workers: int = Field(1, ge=1)
    rollout_threads: int = Field(1, ge=1, description="torch threads per rollout worker")
    learner_threads: int = Field(1, ge=1, description="torch threads of the learner process in async mode")
    timeout_s: float = Field(600.0, gt=0, description="longest wait for a rollout batch before the run stops")
    ray_address: str | None = Field(None, description="backend=ray: cluster address (default: start a local Ray)")


class RunConfig(_Strict):
    plugins: list[str] = Field(default_factory=list, description="your modules or .py files that register parts "
                               "(imported before the recipe is validated; docs/extending.md)")
    preset: str | None = Field(None, description="algorithm preset the recipe builds on (reinforge algos lists them)")
    name: str | None = Field(None, description="run directory name under output_dir (default: a fresh name)")
    output_dir: str = "runs"
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    orchestrate: OrchestrateConfig = Field(default_factory=OrchestrateConfig)

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugin_paths(cls, v: Any) -> Any:
        from reinforge.plugins import normalise_plugin

        v = [v] if isinstance(v, str) else v
        return [normalise_plugin(p) if isinstance(p, str) else p for p in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _async_corrects_off_policy(self) -> RunConfig:
        """Async batches are off-policy by up to max_staleness updates: unless the recipe chose a
        mismatch mode, use truncated IS behaviour -> proximal (the decoupled PPO objective)."""
        if self.orchestrate.mode == "async" and "mode" not in self.algo.mismatch.model_fields_set:
            self.algo.mismatch.mode = "token_tis"
        return self

    @model_validator(mode="after")
    def _env_fits_task(self) -> RunConfig:
        from reinforge.envs.registry import check_task_kind

        check_task_kind(self.env.name, self.task.kind)
        if self.task.kind in ("calculator", "guessing") and not self.env.multi_turn:
            raise ValueError(f"task.kind={self.task.kind} is played in a multi-turn environment: set env.name "
                             f"(e.g. env.name={self.task.kind})")
        return self


    @model_validator(mode="after")
    def _memory_features_fit(self) -> RunConfig:
        if self.train.offload_reference and self.model.lora.enabled:
            raise ValueError("train.offload_reference: a LoRA policy has no reference copy to offload (its reference "
                             "is the base with the adapters disabled); set it to false")
        if self.train.autocast == "bf16" and self.model.device.startswith("cuda"):
            import torch

            if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
                raise ValueError(f"train.autocast=bf16: the GPU of model.device={self.model.device} has no bfloat16")
        return self


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _allowed_keys_hint(e["loc"])
        elif e["type"] == "literal_error":
            msg = msg.replace("Input should be", "allowed values:")
        lines.append(f"  {field}: {msg} (got {e.get('input')!r})" if e["type"] != "extra_forbidden" else f"  {field}: {msg}")
    return "\n".join(lines)


def _allowed_keys_hint(loc: tuple) -> str:
    model: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        model = ann
    return f"; allowed keys here: {', '.join(model.model_fields)}"


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: bad key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def _list_index(item: str, key: str, part: str, items: list[Any]) -> int:
    """``part`` as an index into the list at ``key`` (``reward.terms.1``), or a ConfigError."""
    try:
        index = int(part)
    except ValueError:
        raise ConfigError(f"override {item!r}: {key!r} is a list; index it by position, e.g. {key}.0") from None
    if not -len(items) <= index < len(items):
        raise ConfigError(f"override {item!r}: {key!r} has {len(items)} items; no index {index}")
    return index


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b.c=value`` overrides into a recipe mapping; a list is indexed by position
    (``reward.terms.1.reward_model.path=/models/rm``). Missing sections are created."""
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for depth, part in enumerate(path[:-1]):
            if isinstance(node, list):
                node = node[_list_index(item, ".".join(path[:depth]), part, node)]
                continue
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict | list):
                raise ConfigError(f"override {item!r}: {part!r} is a value, not a section")
            node = nxt
        if isinstance(node, list):
            node[_list_index(item, ".".join(path[:-1]), path[-1], node)] = value
        else:
            node[path[-1]] = value
    return data


def resolve_recipe_path(recipe: str | None) -> Path:
    """A recipe file path, or the name of a shipped recipe (``default``)."""
    if recipe is None:
        recipe = DEFAULT_RECIPE
    path = Path(recipe)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / f"{recipe.removesuffix('.yaml')}.yaml"
    if shipped.is_file():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise ConfigError(f"recipe {recipe!r} is neither a file nor a shipped recipe (shipped: {', '.join(names)})")


TASK_DATA_PATH_KEYS = ("path", "heldout_path")


def _next_to_recipe(value: Any, recipe_dir: Path) -> str | None:
    """``recipe_dir / value`` made absolute when ``value`` is a relative path (or glob) naming something
    there; None otherwise (the value then stays relative to the working directory)."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return None
    if any(ch in value for ch in "*?["):
        try:
            found = next(iter(recipe_dir.glob(value)), None) is not None
        except (ValueError, NotImplementedError):  # a pattern pathlib does not take: leave it to the reader
            found = False
    else:
        found = (recipe_dir / value).exists()
    return os.path.normpath((recipe_dir / value).absolute()) if found else None


def _verifier_next_to_recipe(value: Any, recipe_dir: Path) -> str | None:
    """A ``file.py:function`` verifier whose file is next to the recipe, with that file made absolute."""
    if not isinstance(value, str) or ":" not in value:
        return None
    target, _, attr = value.rpartition(":")
    found = _next_to_recipe(target, recipe_dir) if target.endswith(".py") else None
    return f"{found}:{attr}" if found else None


def _resolve_recipe_paths(data: dict[str, Any], recipe_dir: Path) -> None:
    """In place: the recipe's relative paths that name something next to the recipe file become
    absolute: ``model.path``, ``task.path``, ``task.heldout_path`` (files, directories or globs),
    ``file.py:function`` verifiers (``task.verifier``, a reward term's ``verifier``) and a reward
    term's ``reward_model.path``. Any other value is kept as given (relative to the working
    directory, as before)."""
    plugins = data.get("plugins")
    for i, name in enumerate(plugins if isinstance(plugins, list) else []):
        if isinstance(name, str) and name.endswith(".py") and (found := _next_to_recipe(name, recipe_dir)):
            plugins[i] = found
    sections = {key: data.get(key) for key in ("model", "task", "reward")}
    model, task, reward = (v if isinstance(v, dict) else {} for v in sections.values())
    for section, key in [(model, "path"), *((task, k) for k in TASK_DATA_PATH_KEYS)]:
        if (found := _next_to_recipe(section.get(key), recipe_dir)) is not None:
            section[key] = found
    if (found := _verifier_next_to_recipe(task.get("verifier"), recipe_dir)) is not None:
        task["verifier"] = found
    terms = reward.get("terms")
    for term in terms if isinstance(terms, list) else []:
        if not isinstance(term, dict):
            continue
        if (found := _verifier_next_to_recipe(term.get("verifier"), recipe_dir)) is not None:
            term["verifier"] = found
        rm = term.get("reward_model")
        if isinstance(rm, dict) and (found := _next_to_recipe(rm.get("path"), recipe_dir)) is not None:
            rm["path"] = found


def load_config(recipe: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe YAML (or a shipped recipe name, default ``default``) + dotted overrides -> RunConfig.

    Precedence, lowest first: the recipe's own ``preset``, the recipe, a ``preset=NAME`` override
    (switching the algorithm replaces the recipe's keys that the preset sets), the other overrides.
    A relative path written in the recipe (data, model, reward model, ``file.py:function`` verifier)
    is found next to the recipe file when it exists there (shipped recipes use ``data/...``);
    overrides are taken as given.
    """
    path = resolve_recipe_path(str(recipe) if recipe is not None else None)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    _resolve_recipe_paths(data, path.parent)  # the recipe's own paths only: overrides stay relative to the cwd
    overrides = list(overrides or [])
    switched = [o for o in overrides if o.split("=", 1)[0].strip() == "preset"]
    if switched:  # a preset named on the command line switches the algorithm: its keys replace the recipe's
        data = apply_overrides(data, switched[-1:])
        data = deep_merge(data, load_preset(str(data["preset"])))
    data = apply_overrides(data, [o for o in overrides if o not in switched])
    return config_from_dict(data, source=str(path))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESETS_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"preset: unknown preset {name!r}; allowed: {', '.join(preset_names())}")
    return path


def preset_summary(name: str) -> str:
    """The preset's leading comment: the algorithm, its paper and what it combines."""
    lines = []
    for line in preset_path(name).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    return " ".join(lines)


def load_preset(name: str) -> dict[str, Any]:
    return yaml.safe_load(preset_path(name).read_text()) or {}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``, section by section (neither is modified)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from_dict(data: dict[str, Any], source: str = "config") -> RunConfig:
    """Validate a recipe mapping; a ``preset: NAME`` key puts that preset's sections under the recipe's."""
    preset = data.get("preset")
    if preset is not None:
        if not isinstance(preset, str):
            raise ConfigError(f"invalid config ({source}):\n  preset: must be a preset name (got {preset!r})")
        data = deep_merge(load_preset(preset), data)
    from reinforge.plugins import load_plugins

    plugins = data.get("plugins") or []
    load_plugins([plugins] if isinstance(plugins, str) else plugins)  # their parts register before validation
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
