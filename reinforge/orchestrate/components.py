"""Everything a run needs, built from its config: tokenizer, learner, rollout engine, tasks, environment."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from reinforge.algo.objective import required_inputs
from reinforge.config import RunConfig
from reinforge.data.base import TaskSplits
from reinforge.data.samplers import TaskSamplerPart, build_task_sampler
from reinforge.data.sources import build_task_splits
from reinforge.envs.base import Environment
from reinforge.envs.registry import build_environment
from reinforge.errors import ConfigError
from reinforge.learn import distributed
from reinforge.learn.critic import build_critic
from reinforge.learn.learner import Learner
from reinforge.learn.lora import adapter_weights, is_lora_model, merged_weights
from reinforge.learn.role_adapters import RoleAdapters
from reinforge.models.adapters import ADAPTER_NAME
from reinforge.models.lean_lora import AdapterWeights
from reinforge.models.loading import load_model, load_tokenizer
from reinforge.orchestrate.collectors import Collector, build_collector, episode_limits, sampling_params
from reinforge.orchestrate.multi_turn import EpisodeLimits
from reinforge.parts import all_kinds
from reinforge.plugins import load_plugins
from reinforge.rewards.build import run_reward_pool
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import Verifier
from reinforge.rollout.engines import build_engine as build_rollout_engine
from reinforge.rollout.engines import effective_engine, engine_spec, with_mixin
from reinforge.rollout.openai_engine import OpenAIRolloutEngine
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams


@dataclass
class Components:
    cfg: RunConfig
    tokenizer: object
    learner: Learner | RoleAdapters
    engine: TorchRolloutEngine | OpenAIRolloutEngine
    splits: TaskSplits
    sampler: TaskSamplerPart
    verifier: Verifier
    reward_pool: VerifierPool
    make_env: Callable[[], Environment]

    @property
    def model_context(self) -> int | None:
        return getattr(self.learner.model.config, "max_position_embeddings", None)

    def episode_limits(self) -> EpisodeLimits:
        return episode_limits(self.cfg.env, self.cfg.rollout, self.model_context)

    def sampling_params(self) -> SamplingParams:
        return sampling_params(self.cfg.rollout)

    def make_collector(self) -> Collector:
        """The collector over this process's engine (an agent-driven one starts its proxy server: close it)."""
        return build_collector(self.cfg.env, self.cfg.rollout, self.engine, self.make_env, self.reward_pool,
                               self.model_context)


def episode_side(cfg: RunConfig, engine, pool: VerifierPool, context: int | None
                 ) -> tuple[Callable[[], Environment], Collector]:
    """What plays the run's episodes over ``engine``: its environment factory (scoring through ``pool``)
    and the collector its environment declares. The one assembly of them: training (``build_components``),
    the rollout workers and ``reinforge eval`` with a recipe all build theirs here."""
    make_env = environment_factory(cfg, pool)
    return make_env, build_collector(cfg.env, cfg.rollout, engine, make_env, pool, context)


def environment_factory(cfg: RunConfig, pool: VerifierPool) -> Callable[[], Environment]:
    """The run's environment (``env.name``), scoring through ``pool`` (timeouts, ``reward.on_error``)."""
    return build_environment(cfg.env.name, pool.as_verifier(), cfg.task.system_prompt, cfg.env.params)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _MergesLora:
    """A rollout engine of a LoRA run: the loop hands ``update_weights`` the learner's peft model;
    the engine receives its merged weights (learn/lora.py), as a plain model of the base's
    architecture has them (``model.lora.sync=merged``, the default)."""

    def update_weights(self, state: Mapping[str, torch.Tensor] | torch.nn.Module, version: int) -> None:
        super().update_weights(merged_weights(state) if is_lora_model(state) else state, version)  # type: ignore[misc]


class _SendsAdapters:
    """A rollout engine of a LoRA run with ``model.lora.sync=adapter``: it keeps the base and receives
    every adapter's A and B alone (``learn.lora.adapter_weights``), applied unmerged at decode time;
    a request runs the adapter it names, else ``default_adapter`` (one adapter: every request runs it;
    ``env.role_adapters``: one per role, each named by its role)."""

    def update_weights(self, state: Mapping[str, torch.Tensor] | torch.nn.Module, version: int) -> None:
        if is_lora_model(state):
            for name in state.peft_config:  # type: ignore[union-attr]
                self.update_adapter(name, adapter_weights(state, name), version)  # type: ignore[attr-defined]
        else:
            super().update_weights(state, version)  # type: ignore[misc]


class _GathersShards:
    """The rollout engine of one rank of an FSDP2 run (``train.parallel=fsdp``): ``update_weights``
    receives the learner's sharded policy and copies its whole weights, gathered from all ranks
    (a collective: every rank updates its engine at the same time)."""

    def update_weights(self, state: Mapping[str, torch.Tensor] | torch.nn.Module, version: int) -> None:
        super().update_weights(distributed.rollout_weights(state) if isinstance(state, torch.nn.Module)  # type: ignore[misc]
                               else state, version)


LoraTorchRolloutEngine = with_mixin(_MergesLora, TorchRolloutEngine)


def build_engine(cfg: RunConfig, policy: torch.nn.Module, tokenizer, seed: int | None = None,
                 copy_policy: bool = True):
    """The run's rollout engine (``rollout.engine``, a registered ``EngineSpec``) over ``policy``, the
    plain model (for LoRA: before its adapters are added, which start at zero), sampling from ``seed``
    (default: the run's). A LoRA run's engine takes merged weights; an FSDP2 rank's gathers the shards.
    ``copy_policy=False``: ``policy`` is the engine's own (a rollout worker's or evaluation's copy)."""
    mixins: tuple[type, ...] = ()
    adapters = cfg.model.lora.enabled and cfg.model.lora.sync == "adapter"
    if adapters and not engine_spec(cfg.rollout.engine).takes_adapters:
        raise ConfigError(f"model.lora.sync=adapter: rollout.engine={cfg.rollout.engine} does not apply unmerged "
                          "adapters; use rollout.engine=torch or vllm, or model.lora.sync=merged")
    if cfg.model.lora.enabled:
        mixins = (_SendsAdapters,) if adapters else (_MergesLora,)
    elif cfg.train.world_size > 1 and cfg.train.parallel == "fsdp":  # (LoRA with FSDP is refused)
        mixins = (_GathersShards,)
    engine = build_rollout_engine(cfg.rollout, policy, tokenizer, cfg.model.device,
                                  cfg.seed if seed is None else seed, cfg.model.path, copy_policy=copy_policy,
                                  mixins=mixins, adapter_rank=cfg.model.lora.r if adapters else None)
    if adapters:  # none trained yet (the base); fails early if unsupported
        names = cfg.env.role_adapters or [ADAPTER_NAME]
        engine.default_adapter = None if cfg.env.role_adapters else ADAPTER_NAME  # roles name theirs
        for name in names:
            engine.update_adapter(name, AdapterWeights({}), None)
    return engine


@dataclass
class RolloutSide:
    """What samples and scores a run's episodes on its own copy of the policy (a rollout worker):
    the engine, the reward pool and the collector, with the run's sampling parameters."""

    engine: TorchRolloutEngine | OpenAIRolloutEngine
    pool: VerifierPool
    collector: Collector
    params: SamplingParams

    def close(self) -> None:
        self.collector.close()
        self.pool.close()


def build_rollout_side(cfg: RunConfig, seed: int) -> RolloutSide:
    """A rollout worker's components: its own model copy from ``model.path`` under the run's engine
    (``build_engine``, sampling from ``seed``), the run's reward pool and the collector its environment
    declares (``episode_side``), as ``build_components`` builds the learner process's."""
    register_parts(cfg)
    tokenizer = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device)
    engine = build_engine(cfg, model, tokenizer, seed, copy_policy=False)
    pool = run_reward_pool(cfg)
    _, collector = episode_side(cfg, engine, pool, getattr(model.config, "max_position_embeddings", None))
    return RolloutSide(engine, pool, collector, sampling_params(cfg.rollout))


def register_parts(cfg: RunConfig) -> None:
    """Every built-in part and the recipe's plug-ins registered in this process: a spawned one (a rank,
    a rollout worker) starts with none, its config arriving unpickled, not validated."""
    all_kinds()
    load_plugins(cfg.plugins)


def resolve_config(cfg: RunConfig) -> RunConfig:
    """The run's config with what depends on other sections or on the environment filled in (a copy;
    the validators only check, and ``cfg`` is not changed):

    - ``model.device``: ``auto`` becomes ``cuda`` when a GPU is present, else ``cpu`` (``resolved_device``);
    - ``rollout.engine``: an entry that stands for another (``auto``) becomes the engine it chooses
      (``effective_engine``, the value the config checks read);
    - ``train.world_size``: under torchrun, the processes it started (``distributed.resolved_world_size``);
    - ``algo.mismatch.mode``: async batches are off-policy by up to max_staleness updates, so unless
      the recipe chose a mode an async run uses truncated IS behaviour -> proximal (``token_tis``,
      the decoupled PPO objective).

    ``orchestrate/run.py`` resolves before building anything and saves the result in ``config.yaml``;
    everything that builds an engine from a config builds it from a resolved one."""
    register_parts(cfg)  # a spawned rank resolves again: the engine's entry is looked up
    resolved = cfg.model_copy(deep=True)
    resolved.model.device = cfg.model.resolved_device()
    resolved.rollout.engine = effective_engine(cfg)
    resolved.train.world_size = distributed.resolved_world_size(cfg)
    if cfg.orchestrate.mode == "async" and "mode" not in cfg.algo.mismatch.model_fields_set:
        resolved.algo.mismatch.mode = "token_tis"
    return resolved


def build_components(cfg: RunConfig) -> Components:
    """Every component of a run, from its resolved config (``resolve_config``). With several ranks
    (learn/distributed.py) each rank builds its own, all from the same seed: the learner shares or
    shards the policy, each engine samples its rank's share of the prompts (``distributed.seed_rollout``
    gives each rank its own random stream)."""
    register_parts(cfg)
    if cfg.model.device == "auto":
        raise ConfigError("model.device=auto: build_components takes a resolved config (resolve_config(cfg))")
    distributed.check(cfg)
    seed_everything(cfg.seed)
    splits = build_task_splits(cfg.task, cfg.env)  # fail on bad data before loading any model
    tokenizer = load_tokenizer(cfg.model.path)
    policy = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device)
    needs = required_inputs(cfg.algo)  # what the run's parts declare (registry.Entry.needs)
    # The reference: a frozen second copy; with LoRA the base itself, adapters disabled (no copy).
    # A per-prompt value sampled from the reference policy (value_estimates.py) needs one too.
    with_ref = bool({"ref_logp", "optimal_value", "reference_value"} & needs) and not cfg.model.lora.enabled
    ref = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device) if with_ref else None
    # The teacher of a distillation term (GKD): frozen, the same tokenizer as the policy.
    teacher = load_model(cfg.algo.teacher.path, cfg.model.dtype, cfg.model.device) \
        if "teacher_logp_vocab" in needs else None
    critic = (
        build_critic(cfg.model.path, cfg.algo.critic, cfg.model.dtype, cfg.model.device)
        if "values" in needs else None
    )
    engine = build_engine(cfg, policy, tokenizer)  # before the learner adds LoRA adapters to the policy
    pool = run_reward_pool(cfg)
    return Components(
        cfg=cfg,
        tokenizer=tokenizer,
        learner=RoleAdapters.for_run(policy, cfg, teacher) if cfg.env.role_adapters
        else Learner.for_run(policy, cfg, ref, critic, teacher),
        engine=engine,
        splits=splits,
        sampler=build_task_sampler(cfg.task.sampler.name, splits.train, cfg.seed, cfg.task.sampler.settings()),
        verifier=pool.verifier,
        reward_pool=pool,  # environments score through the pool too (timeouts, reward.on_error)
        make_env=environment_factory(cfg, pool),
    )
