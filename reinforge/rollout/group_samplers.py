"""Group samplers: how the ``n`` completions of each prompt's group are produced (``rollout.group_sampler``).

A group sampler returns, like ``RolloutEngine.generate``, ``params.n`` generations per request in
request order (every generation with its tokens' sampling log-probs and policy version). It may call
the engine as it likes: in rounds, from shared partial completions (trees), or reusing earlier samples.

Two forms are registered alike:

* a function ``fn(engine, requests, params[, cfg])`` (stateless, e.g. ``independent``);
* a class built once per collector as ``cls([cfg])`` with ``sample(engine, requests, params)``, and
  optionally ``state_dict()`` / ``load_state_dict(state)`` (JSON-able, saved in checkpoints so a
  resumed run samples what the uninterrupted one would have; e.g. SPEC-RL's cache of earlier
  rollouts), ``counters() -> dict[str, float]`` (what the last call generated and reused) and
  ``held() -> dict[str, int]`` (the prompts, by request id, whose generations it carries into the next
  step and how many each: the batch source requests them first, with that many samples; T-PPO's
  truncated rollouts, whose entry declares ``needs=("carry_over",)``).

``build_group_sampler`` gives either form the class interface (``GroupSampler``). Every sampler's
``counters()`` report ``tokens_generated`` (tokens the engine decoded) and, when it reuses tokens it
did not decode, ``tokens_reused``, plus counters of its own named ``<sampler>/<what>``, which the
collector adds to the step's metrics as ``rollout/<sampler>/<what>``. A generation's ``extra`` dict
(e.g. the tree a sample belongs to) is copied into its trajectory's metadata; a sample that reuses
tokens says how many in ``extra['tokens_reused']``, from which the step's ``rollout/tokens_generated``
and ``rollout/tokens_reused`` are counted (``orchestrate/step_metrics.token_metrics``). Built in: ``independent`` (here), ``spec_rl`` (rollout/spec_rl.py), ``treepo``
(rollout/tree_sampler.py), ``eptree`` (rollout/eptree.py), ``tppo`` (rollout/tppo.py), ``micro_groups`` (rollout/micro_groups.py), ``hbpo_budgets`` (rollout/budget_groups.py);
docs/strategies.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from reinforge.registry import Registry, kind
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

GroupSamplerFn = Callable[..., Any]
GROUP_SAMPLERS: Registry[GroupSamplerFn] = kind("group_sampler", Registry("group sampler"))


class GroupSampler(Protocol):
    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def counters(self) -> dict[str, float]: ...
    def held(self) -> dict[str, int]: ...


@GROUP_SAMPLERS.register("independent", formula="y_1, ..., y_G ~ pi(. | x) independently", paper="-")
def independent(engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
    """Every completion sampled independently from the prompt: one ``engine.generate`` call."""
    return engine.generate(list(requests), params)


class _GroupInputs:
    def __init__(self, engine: Any = None, requests: Sequence[GenerationRequest] = (),
                 params: SamplingParams | None = None) -> None:
        self.engine, self.requests, self.params = engine, requests, params


class _FunctionSampler:
    """A stateless function sampler with the class interface; it counts the tokens it returns as generated."""

    def __init__(self, name: str, settings: Any) -> None:
        self.name, self.settings, self._counters = name, settings, {}

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        out = GROUP_SAMPLERS.call(self.name, _GroupInputs(engine, requests, params), self.settings)
        self._counters = {"tokens_generated": float(sum(len(g.token_ids) for g in out))}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def held(self) -> dict[str, int]:
        return {}

    def counters(self) -> dict[str, float]:
        return dict(self._counters)


class _Completed:
    """Fills in the optional methods a class sampler does not define."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        out = self.inner.sample(engine, requests, params)
        self._fallback = {"tokens_generated": float(sum(len(g.token_ids) for g in out))}
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict() if hasattr(self.inner, "state_dict") else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if hasattr(self.inner, "load_state_dict"):
            self.inner.load_state_dict(state)

    def held(self) -> dict[str, int]:
        return self.inner.held() if hasattr(self.inner, "held") else {}

    def counters(self) -> dict[str, float]:
        if hasattr(self.inner, "counters"):
            return self.inner.counters()
        return dict(getattr(self, "_fallback", {}))


def build_group_sampler(name: str, settings: Any = None) -> GroupSampler:
    """The registered group sampler ``name`` (its settings as ``cfg``) with the class interface (the
    built-in ones are registered by ``reinforge.parts.all_kinds()``, as for every recipe)."""
    entry = GROUP_SAMPLERS.entry(name)
    if inspect.isclass(entry.fn):
        return _Completed(GROUP_SAMPLERS.call(name, _GroupInputs(), settings))
    return _FunctionSampler(name, settings)

