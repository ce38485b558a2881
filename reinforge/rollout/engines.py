"""Rollout engines as registered parts (``rollout.engine``): what produces a run's completions.

An entry is an ``EngineSpec``: ``make(rollout, policy, tokenizer, device, seed, model_path, copy_policy)`` builds
the engine from the recipe's ``rollout`` section and the learner's policy (the engine owns a copy,
or sets a server's weights to it), and two declarations the loop and the config checks read
instead of the engine's name:

* ``replicable``: every process can hold its own engine with its own copy of the weights, so
  asynchronous rollout workers and data-parallel ranks can each run one;
* ``needs_server``: the engine drives a server at ``rollout.server_url``;
* ``takes_adapters``: the engine applies unmerged LoRA adapters (``update_adapter``), so a LoRA run
  can send it the adapter tensors alone (``model.lora.sync=adapter``);
* ``resolve`` (optional): the entry stands for another engine, chosen from the whole run config
  (``auto``: the faster engine for the model and hardware). ``effective_engine`` computes the choice
  (the config checks read it, assigning nothing); ``orchestrate.components.resolve_config`` writes it
  into the run's resolved config, which names the chosen engine.

An engine object has ``generate(requests, params)``, ``update_weights(model_or_state, version)``,
``tokenizer``, ``pad_id``, ``generator`` (a ``torch.Generator``, saved in checkpoints) and
``version`` (``rollout/types.py`` describes requests and generations). Optionally ``reports_steps =
False`` when ``generate(..., on_step=...)`` (a callback per decode step) is refused: ``reinforge serve``
then answers streaming and top-log-prob requests with a 400 instead of a failed batch.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reinforge.registry import Registry, kind


@dataclass(frozen=True)
class EngineSpec:
    name: str
    replicable: bool
    needs_server: bool
    description: str
    engine_class: type
    resolve: Callable[[Any], str] | None = None
    takes_adapters: bool = False


ROLLOUT_ENGINES: Registry[EngineSpec] = kind("engine", Registry("rollout engine"))


def register_engine(name: str, *, description: str, replicable: bool, needs_server: bool = False,
                    paper: str = "-", resolve: Callable[[Any], str] | None = None,
                    takes_adapters: bool = False) -> Callable[[type], type]:
    """Register an engine class as ``rollout.engine: name``; the class provides
    ``from_config(rollout, policy, tokenizer, device, seed, model_path, copy_policy=True)``
    (``policy`` is the plain model, before any LoRA adapters; an engine that keeps weights in
    process copies it unless ``copy_policy`` is false, as in a rollout worker that loaded its own)."""

    def deco(cls: type) -> type:
        spec = EngineSpec(name, replicable, needs_server, description, cls, resolve, takes_adapters)
        ROLLOUT_ENGINES.register(name, description=description, paper=paper)(spec)
        return cls

    return deco


def engine_spec(name: str) -> EngineSpec:
    return ROLLOUT_ENGINES.get(name)


def effective_engine(cfg: Any) -> str:
    """The engine a run config (``RunConfig``) samples with: ``rollout.engine``, or the one an entry
    that stands for another (``EngineSpec.resolve``, e.g. ``auto``) chooses for the run. Computed,
    never assigned: the config checks read it; ``resolve_config`` records it in the resolved copy."""
    resolve = engine_spec(cfg.rollout.engine).resolve
    return cfg.rollout.engine if resolve is None else resolve(cfg)


def build_engine(rollout: Any, policy: Any, tokenizer: Any, device: str, seed: int, model_path: str,
                 copy_policy: bool = True, mixins: tuple[type, ...] = (), adapter_rank: int | None = None) -> Any:
    """The one way to build a rollout engine: the class ``rollout.engine`` names (from a resolved
    config: ``auto`` already replaced by its ``effective_engine``), with ``mixins``' ``update_weights``
    in front (e.g. a LoRA run's merge), from its ``from_config``; ``adapter_rank`` (the LoRA rank of a run with
    adapter-only sync, for engines that declare ``takes_adapters``) is passed on to it. The training run, the rollout workers, evaluation, serving and the reference
    engine of prompt values all build theirs here."""
    engine_class = engine_spec(rollout.engine).engine_class
    for mixin in mixins:
        engine_class = with_mixin(mixin, engine_class)
    options = {} if adapter_rank is None else {"adapter_rank": adapter_rank}  # only engines that take adapters get it
    return engine_class.from_config(rollout, policy, tokenizer, device, seed, model_path, copy_policy=copy_policy,
                                    **options)


@functools.cache
def with_mixin(mixin: type, engine_class: type) -> type:
    """``engine_class`` with ``mixin``'s ``update_weights`` in front (one class per pair)."""
    return type(f"{mixin.__name__.strip('_')}{engine_class.__name__}", (mixin, engine_class), {})


def own_copy(policy: Any) -> Any:
    """The engine's own copy of the learner's weights."""
    return copy.deepcopy(policy)


def context_limit(engine: Any) -> int | None:
    """The most positions (prompt + completion) ``engine`` can run: its ``max_positions`` if it
    declares one, else its model's ``max_position_embeddings``; None when it says nothing."""
    declared = getattr(engine, "max_positions", None)
    if declared is not None:
        return int(declared)
    return getattr(getattr(getattr(engine, "model", None), "config", None), "max_position_embeddings", None)
