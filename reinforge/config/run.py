"""The run's other sections and ``RunConfig``, the whole of a recipe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from reinforge.config.algo import AlgoConfig
from reinforge.config.base import (
    GroupSamplerConfig,
    InlineOptions,
    InlineSection,
    PartConfig,
    _check_registered,
    _Strict,
)
from reinforge.config.demonstrations import DemonstrationsConfig, PreferencesConfig
from reinforge.config.model import ModelConfig
from reinforge.config.orchestrate import OrchestrateConfig
from reinforge.config.task import AgentTaskConfig, ArithmeticTaskConfig, RewardConfig, TaskConfig


class ReplayConfig(PartConfig):
    """RePO's replay: past samples of each prompt mixed into its group (a registered replay strategy
    with the buffer's settings; docs/strategies.md)."""

    KIND: ClassVar[str] = "replay"


class BudgetConfig(PartConfig):
    """Samples per prompt under a step's total (a registered rollout budget, e.g. ``knapsack``)."""

    KIND: ClassVar[str] = "budget"


class HintsConfig(PartConfig):
    """Guidance by hints: the groups whose samples all failed sampled again with part of the reference
    solution as a hint (a registered hint part, e.g. ``ghpo``, ``guide``; docs/strategies.md)."""

    KIND: ClassVar[str] = "hints"


class RolloutConfig(_Strict):
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=1, description="samples per prompt (G)")
    group_sampler: GroupSamplerConfig = Field(default_factory=GroupSamplerConfig,
                                              description="how a group's completions are produced")
    replay: ReplayConfig | None = Field(None, description="mix each prompt's past samples into its group "
                                        "(RePO): {name: recent|highest|random|max_variance|all, <option>: value, ...}")
    budget: BudgetConfig | None = Field(None, description="per-prompt group sizes under a total (Knapsack RL): "
                                        "{name: knapsack, <option>: value, ...}; none: group_size for every prompt")
    hints: HintsConfig | None = Field(None, description="sample the groups that all failed again with a hint "
                                      "(part of the reference solution): {name: ghpo|guide, <option>: value, ...}")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = off")
    stop: list[str] = Field(default_factory=list, description="stop strings (the stop string is kept)")
    engine: str = Field(
        "torch", description="a registered rollout engine: 'torch' (in process), 'vllm' (vLLM in process, "
        "`make install-vllm`), 'auto' (the faster of the two for the model and hardware), 'openai' (any "
        "OpenAI-compatible server at server_url), or a plug-in's"
    )
    server_url: str | None = Field(None, description="base URL of the server for engine=openai, e.g. http://host:8000/v1")
    server_model: str | None = Field(None, description="model name the server expects (default: model.path)")
    sync_weights: bool = Field(True, description="engine=openai: push new weights to the server after each update")
    ignore_eos: bool = Field(False, description="generate exactly max_new_tokens (benchmarks, throughput tests)")

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, v: str) -> str:
        return _check_registered("engine", v)


class TrainConfig(_Strict):
    steps: int = Field(200, ge=1, description="RL steps (rollout batch + updates)")
    lr: float = Field(5e-5, gt=0)
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0, description="AdamW's epsilon: the update is m / (sqrt(v) + eps)")
    grad_clip: float = Field(1.0, gt=0)
    minibatches: int = Field(1, ge=1, description="optimizer steps per epoch over a rollout batch")
    minibatch_by: Literal["rows", "groups"] = Field(
        "rows", description="how a batch is cut into mini-batches: rows = rows in a random order; groups = whole "
        "groups in a random order (each group's prompt then computed once per update with shared_prefix; one "
        "process)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch")
    old_logprobs: Literal["recompute", "rollout"] = Field(
        "recompute", description="pi_old of the PPO ratio where an update needs it (several optimizer steps a batch, "
        "the KL in the reward): recompute = a no-grad pass of the learner at the start of the update; rollout = the "
        "sampler's log-probs, no pass (they differ from the learner's by the engines' mismatch, logged as "
        "logprob_mismatch on the first mini-batch; not with demonstrations); docs/algorithms.md"
    )
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
    autocast: Literal["none", "bf16", "auto"] = Field(
        "none", description="bf16: run the policy/reference forwards under torch.autocast(bfloat16); auto: bf16 "
        "where the device computes bf16 natively (a GPU with bfloat16, a CPU with AVX512-BF16/AMX/Arm BF16), else none; log-probs, "
        "losses, weights and optimizer state stay float32"
    )
    logprob_chunk_tokens: int = Field(
        0, ge=0, description="> 0: the LM head's log-probs and entropies over this many positions at a time, each "
        "chunk's float32 logits recomputed in the backward instead of kept (never the [N, T, V] logits at once; "
        "about one more lm_head forward); 0: the model's own forward; exact either way (docs/memory.md)"
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

    @model_validator(mode="after")
    def _chunked_head_fits(self) -> TrainConfig:
        if self.logprob_chunk_tokens > 0 and self.parallel == "fsdp":
            raise ValueError("train.logprob_chunk_tokens > 0 calls the model's lm_head outside its forward, where "
                             "train.parallel=fsdp (FSDP2) has not gathered its parameters; use train.parallel=ddp or "
                             "train.logprob_chunk_tokens=0")
        return self


class EvalConfig(_Strict):
    every: int = Field(20, ge=0, description="held-out evaluation every N steps (0 = only before and after)")
    max_new_tokens: int | None = Field(None, description="default: rollout.max_new_tokens")
    final_samples: int = Field(
        0, ge=0, description="before and after training: mean@n, pass@k, maj@k with n samples (eval.json, passk.png)"
    )
    final_temperature: float = Field(1.0, gt=0)
    picture_ablation: bool = Field(
        False, description="with pictures: also greedy accuracy with every picture blank and with the pictures "
        "shuffled among the held-out rows (eval/heldout_acc_blank, eval/heldout_acc_shuffled; docs/vision.md)")


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


class LatencySettings(BaseModel):
    """``env.latency``: the delay `envs/latency.py` adds to every environment step."""

    model_config = ConfigDict(extra="forbid")

    dist: Literal["fixed", "lognormal"] = Field("fixed", description="the delay's distribution")
    mean_s: float = Field(gt=0, le=600, description="mean delay of a step, in seconds")
    sigma: float = Field(0.5, ge=0, le=3, description="lognormal: the shape (the log-delay's standard deviation)")
    asynchronous: bool = Field(False, description="step is an async def awaiting the delay")


class EnvConfig(InlineSection):
    """The environment an episode runs in: ``single_turn`` (one completion scored by the reward) or a
    multi-turn environment (reinforge/envs/registry.py), with the episode limits. The environment's
    keyword arguments are written inline, ``env: {name: guessing, max_guesses: 6, max_turns: 6}``
    (checked against its factory's signature); ``params`` holds them."""

    KIND: ClassVar[str] = "env"
    name: str = Field("single_turn", description="single_turn, calculator, guessing, retry (reinforge/envs); "
                      "the environment's keyword arguments go beside it")
    max_turns: int = Field(4, ge=1, description="model turns per episode")
    max_total_tokens: int = Field(0, ge=0, description="whole episode incl. prompt; 0 = the model's context")
    max_turn_tokens: int = Field(0, ge=0, description="tokens per model turn; 0 = rollout.max_new_tokens")
    agent: str | None = Field(None, description="env.name=agent: 'module:function' taking (base_url, task) and "
                              "returning the episode's reward (or posting it to the proxy)")
    agent_workers: int = Field(8, ge=1, description="env.name=agent: agent episodes run concurrently")
    agent_api_key: str | None = Field(None, description="env.name=agent: the proxy requires 'Authorization: Bearer "
                                      "KEY' of every call (agents read it with reinforge.serve.agent_auth.api_key)")
    agent_reward_endpoint: bool = Field(True, description="env.name=agent: false = rewards only from the agent "
                                        "function's return value (every reward post is refused)")
    concurrency: int = Field(64, ge=1, description="environment calls (steps, resets) of a turn run at once; "
                             "1 = one after another (the trajectories are the same either way)")
    step_timeout_s: float = Field(60.0, ge=0, description="an environment call running longer ends its episode "
                                  "(truncated: env_timeout); 0 = no limit")
    latency: LatencySettings | None = Field(None, description="add a delay to every environment step "
                                            "(benchmarks, tests): {dist: fixed|lognormal, mean_s, sigma}")
    train_roles: list[str] | None = Field(None, description="an environment with roles (docs/multi_agent.md): the "
                                          "roles whose model turns are trained; the others' turns are observations "
                                          "(loss mask 0); null = every role")
    role_adapters: list[str] | None = Field(None, description="one policy per role (docs/multi_agent.md): a LoRA "
                                            "adapter of its own for each listed role, which samples that role's "
                                            "turns and trains on them alone (needs model.lora.enabled and "
                                            "model.lora.sync=adapter); an unlisted role is played by the base")

    @classmethod
    def inline_options(cls, data: Mapping[str, Any]) -> InlineOptions | None:
        name = data.get("name", cls.model_fields["name"].default)
        if not isinstance(name, str):
            return None
        _check_registered("env", name)
        from reinforge.envs.registry import environment_spec

        return InlineOptions("name", name, list(environment_spec(name).params))

    @property
    def params(self) -> dict[str, Any]:
        """The environment's keyword arguments (its factory's defaults for the others)."""
        return dict(self._options or {})

    @model_validator(mode="after")
    def _agent_spec(self) -> EnvConfig:
        from reinforge.envs.registry import environment_spec

        if environment_spec(self.name).agent_driven != (self.agent is not None):
            raise ValueError("env.agent ('module:function') goes with env.name=agent, and env.name=agent needs it")
        spec = environment_spec(self.name)
        for name in ("train_roles", "role_adapters"):
            if getattr(self, name) is not None and (not spec.multi_turn or spec.agent_driven):
                raise ValueError(f"env.{name}: env {self.name} has no roles (roles are for multi-turn environments "
                                 "with a role() method, docs/multi_agent.md)")
        return self

    @property
    def multi_turn(self) -> bool:
        from reinforge.envs.registry import environment_spec

        return environment_spec(self.name).multi_turn


class RunConfig(_Strict):
    plugins: list[str] = Field(default_factory=list, description="your modules or .py files that register parts "
                               "(imported before the recipe is validated; docs/extending.md)")
    preset: str | None = Field(None, description="algorithm preset the recipe builds on (reinforge algos lists them)")
    name: str | None = Field(None, description="run directory name under output_dir (default: a fresh name)")
    output_dir: str = "runs"
    seed: int = 0
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=ArithmeticTaskConfig, description="where the prompts come from; "
                             "the keys depend on task.kind (default: arithmetic)")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    orchestrate: OrchestrateConfig = Field(default_factory=OrchestrateConfig)
    demonstrations: DemonstrationsConfig = Field(default_factory=DemonstrationsConfig)
    preferences: PreferencesConfig = Field(default_factory=PreferencesConfig)

    @field_validator("plugins", mode="before")
    @classmethod
    def _plugin_paths(cls, v: Any) -> Any:
        from reinforge.plugins import normalise_plugin

        v = [v] if isinstance(v, str) else v
        return [normalise_plugin(p) if isinstance(p, str) else p for p in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _engine_fits(self) -> RunConfig:
        """The declarations of the engine the run samples with (``effective_engine``: for ``auto`` the one
        it chooses, which is computed here, not written into the config; ``resolve_config`` does that)."""
        from reinforge.rollout.engines import effective_engine, engine_spec

        engine = effective_engine(self)
        spec = engine_spec(engine)
        if spec.needs_server and not self.rollout.server_url:
            raise ValueError(f"rollout.engine={engine} needs rollout.server_url (e.g. http://127.0.0.1:8000/v1)")
        if spec.replicable:
            return self
        why = (f"rollout.engine={engine} is not replicable (its declaration: e.g. one server whose "
               "weights the learner sets)")
        if self.orchestrate.mode == "async":
            raise ValueError(f"orchestrate.mode=async samples in rollout workers, each with its own copy of the "
                             f"policy; {why}, so it runs with orchestrate.mode=sync")
        if self.train.world_size > 1:
            raise ValueError(f"train.world_size > 1 runs one rollout engine per rank; {why}")
        return self

    @model_validator(mode="after")
    def _strategies_fit(self) -> RunConfig:
        """Rollout strategies and the inputs the loop estimates for a part (config/strategy_checks.py)."""
        from reinforge.config.strategy_checks import check_strategies

        check_strategies(self)
        return self

    @model_validator(mode="after")
    def _demonstrations_are_used(self) -> RunConfig:
        """A part that trains on demonstrations needs them, and demonstrations need such a part."""
        from reinforge.config.demonstrations import check_demonstrations

        check_demonstrations(self)
        return self

    @model_validator(mode="after")
    def _sampled_log_probs_fit(self) -> RunConfig:
        """``train.old_logprobs=rollout``: after the demonstrations' own checks, which say more."""
        from reinforge.config.strategy_checks import sampled_log_probs_fit

        sampled_log_probs_fit(self)
        return self

    @model_validator(mode="after")
    def _preferences_are_used(self) -> RunConfig:
        """Preference pairs are trained on by a loss computed per group (dpo, ipo), offline only."""
        from reinforge.algo.policy_losses import POLICY_LOSSES

        if self.preferences.path is None:
            return self
        if "whole_groups" not in POLICY_LOSSES.needs(self.algo.policy_loss):
            raise ValueError(f"preferences.path: algo.policy_loss={self.algo.policy_loss} does not learn from pairs; "
                             "use policy_loss: dpo (or ipo)")
        if self.demonstrations.path is not None:
            raise ValueError("preferences.path and demonstrations.path: give one source of given rows per run")
        if self.orchestrate.mode == "async":
            raise ValueError("preferences.path trains on pairs only: there is no rollout to run asynchronously; "
                             "use orchestrate.mode=sync")
        return self

    @model_validator(mode="after")
    def _env_fits_task(self) -> RunConfig:
        from reinforge.envs.registry import check_task_kind

        check_task_kind(self.env.name, self.task.kind)
        if isinstance(self.task, AgentTaskConfig) and not self.env.multi_turn:
            raise ValueError(f"task.kind={self.task.kind} is played in a multi-turn environment: set env.name "
                             f"(e.g. env.name={self.task.kind})")
        for i, term in enumerate(self.reward.terms):  # group judges need a prompt's samples together
            if self.env.multi_turn and term.judge is not None and term.judge.mode != "pointwise":
                raise ValueError(f"reward.terms.{i}.judge.mode: a {term.judge.mode} judge scores the samples of a "
                                 f"prompt together; env.name={self.env.name} scores each episode alone: use pointwise")
            co_evolve = term.reward_model is not None and term.reward_model.co_evolve is not None
            if co_evolve and (self.env.multi_turn or self.orchestrate.mode == "async"):
                raise ValueError(f"reward.terms.{i}.reward_model.co_evolve: the reward model learns from the batches "
                                 "the training process scores itself: single-turn, orchestrate.mode=sync")
        return self

    @model_validator(mode="after")
    def _memory_features_fit(self) -> RunConfig:
        if self.train.offload_reference and self.model.lora.enabled:
            raise ValueError("train.offload_reference: a LoRA policy has no reference copy to offload (its reference "
                             "is the base with the adapters disabled); set it to false")
        if self.train.autocast == "bf16" and self.model.resolved_device().startswith("cuda"):
            import torch

            if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
                raise ValueError(f"train.autocast=bf16: the GPU of model.device={self.model.device} has no bfloat16")
        return self


