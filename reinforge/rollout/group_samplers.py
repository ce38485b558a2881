"""Group samplers: how the ``n`` completions of each prompt's group are produced (``rollout.group_sampler``).

A group sampler is a function ``fn(engine, requests, params[, cfg]) -> list[Generation]`` returning,
like ``RolloutEngine.generate``, ``params.n`` generations per request in request order (every
generation with its tokens' sampling log-probs and policy version). It may call the engine as it
likes: in rounds, from shared partial completions (trees), or reusing earlier samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from reinforge.registry import Registry, kind
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

GroupSamplerFn = Callable[..., list[Generation]]
GROUP_SAMPLERS: Registry[GroupSamplerFn] = kind("group_sampler", Registry("group sampler"))


@GROUP_SAMPLERS.register("independent", formula="y_1, ..., y_G ~ pi(. | x) independently", paper="-")
def independent(engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
    """Every completion sampled independently from the prompt: one ``engine.generate`` call."""
    return engine.generate(list(requests), params)


class _GroupInputs:
    def __init__(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> None:
        self.engine, self.requests, self.params = engine, requests, params


def sample_groups(name: str, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams,
                  settings: Any = None) -> list[Generation]:
    """``params.n`` generations per request by the registered group sampler ``name``."""
    return GROUP_SAMPLERS.call(name, _GroupInputs(engine, requests, params), settings)
