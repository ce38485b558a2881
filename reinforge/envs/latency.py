"""A latency wrapper: any environment, with a delay added to every step (``env.latency`` in a recipe).

Agent environments wait on tools; this makes that waiting reproducible for benchmarks and tests of
concurrency (``benchmarks/bench_agent_latency.py``). The delay of a step is ``mean_s`` (``fixed``)
or drawn from a lognormal with mean ``mean_s`` and shape ``sigma`` (mu = ln(mean_s) - sigma^2 / 2,
so E[delay] = mean_s), from a generator seeded by the episode's reset seed: the same episode waits
the same. ``asynchronous: true`` makes ``step`` an ``async def`` that awaits the delay (the event
loop of the environment calls, no thread per call).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from typing import Any

from reinforge.config.run import LatencySettings
from reinforge.envs.base import Environment, StepResult


class DelayedEnv:
    """``env`` whose ``step`` returns after a delay; every other attribute is ``env``'s (e.g. ``tools``)."""

    def __init__(self, env: Environment, settings: LatencySettings) -> None:
        self.env, self.settings = env, settings
        self.rng = random.Random(0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, task, seed: int):
        self.rng = random.Random(seed)
        return self.env.reset(task, seed)

    def delay(self) -> float:
        s = self.settings
        if s.dist == "fixed":
            return s.mean_s
        return self.rng.lognormvariate(math.log(s.mean_s) - s.sigma**2 / 2, s.sigma)

    def step(self, assistant: dict[str, str]) -> StepResult:
        time.sleep(self.delay())
        return self.env.step(assistant)


class AsyncDelayedEnv(DelayedEnv):
    async def step(self, assistant: dict[str, str]) -> StepResult:  # type: ignore[override]
        await asyncio.sleep(self.delay())
        return self.env.step(assistant)


def with_latency(make_env: Callable[[], Environment], settings: LatencySettings | dict) -> Callable[[], Environment]:
    """A factory of ``make_env()``'s environments with the delay ``settings`` on every step."""
    settings = settings if isinstance(settings, LatencySettings) else LatencySettings.model_validate(settings)
    wrapper = AsyncDelayedEnv if settings.asynchronous else DelayedEnv
    return lambda: wrapper(make_env(), settings)  # type: ignore[return-value]
