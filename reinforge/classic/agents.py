"""Classic agents as registered parts (``classic.agent: {name: ppo, <option>: value, ...}``).

An agent is a class built as ``cls(envs, seed, cfg)`` (``cfg``: its settings, a ``registry.Settings``
with at least ``gamma``) around a Gymnasium vector environment. The run (classic/run.py) only calls:

- ``iterate(progress) -> Iteration``: one unit of work (PPO: a rollout and its update; DQN: some
  environment steps and some gradient steps); ``progress`` in [0, 1) is the share of the run done
  (for learning-rate and exploration schedules);
- ``steps_per_iteration``: the environment steps (over all environments) one iteration takes;
- ``act(obs, deterministic) -> actions``: the policy for evaluation (a [B, D] float tensor in);
- ``net`` (the ``nn.Module`` a checkpoint saves) and ``optimizer``, ``generator``;
- ``close()`` if it has one (processes or threads it started).

A new agent is a module that registers its class here and is listed in ``reinforge/parts.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor, nn

from reinforge.registry import Registry, kind


@dataclass
class Iteration:
    """What one ``iterate`` did: the episodes that finished (return, length) and the update's metrics."""

    episodes: list[tuple[float, int]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    rollout_s: float = 0.0


class ClassicAgent(Protocol):
    net: nn.Module
    steps_per_iteration: int

    def iterate(self, progress: float) -> Iteration: ...
    def act(self, obs: Tensor, deterministic: bool) -> Tensor: ...


CLASSIC_AGENTS: Registry[type[ClassicAgent]] = kind("classic_agent", Registry("classic agent"))


class _AgentInputs:
    def __init__(self, envs: Any, seed: int, env_cfg: Any) -> None:
        self.envs, self.seed, self.env_cfg = envs, seed, env_cfg


def build_agent(name: str, envs: Any, seed: int, settings: Any, env_cfg: Any = None) -> ClassicAgent:
    """The registered agent ``name`` on ``envs`` with its validated ``settings`` (an agent that declares an
    ``env_cfg`` parameter also gets ``classic.env``, e.g. to build environments in other processes)."""
    return CLASSIC_AGENTS.call(name, _AgentInputs(envs, seed, env_cfg), settings)
