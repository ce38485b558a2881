"""PettingZoo environments for the multi-agent agents (``classic.env.backend: pettingzoo``), vectorised in
this process behind the contract of the single-agent vector environments (classic/envs.py).

``classic.env.id`` names a PettingZoo environment module, e.g. ``mpe2.simple_spread_v3`` (cooperative
navigation) or ``mpe2.simple_adversary_v3`` (one adversary against two cooperating agents);
``classic.env.kwargs`` are its keyword arguments (``max_cycles``, ``N``, ...). The module's
``parallel_env`` is used; ``backend: pettingzoo_aec`` takes its AEC ``env`` through PettingZoo's
``aec_to_parallel`` instead. Every agent needs a Discrete action space of the same size (the shared
policy's head) and a Box observation; observations of different widths are zero-padded to the widest.

One vector step returns, for E environments and N agents (in ``possible_agents`` order):
observations [E, N, D], rewards [E, N], terminated / truncated [E] (an environment's episode ends when
no agent is left; it is truncated if any agent was), and in ``info``: ``state`` [E, S] (the
environment's global ``state()``, or the agents' padded observations concatenated where it has none),
the same-step autoreset's ``final_obs`` / ``final_state`` / ``_final_obs`` for the environments whose
episode ended, and ``final_info["episode"]`` with ``r`` = the mean over agents of their episode
returns (the team's return when the reward is shared), ``l`` the length, and ``agent_r`` [N] each
agent's return. An agent that leaves before the others gets zero observations and rewards.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from reinforge.errors import ConfigError, ReinforgeError

MULTI_AGENT_BACKENDS = ("pettingzoo", "pettingzoo_aec")  # classic.env.backend values of this module


def _module(env_id: str) -> Any:
    try:
        import pettingzoo  # noqa: F401
    except ImportError:
        raise ReinforgeError("multi-agent environments need PettingZoo: pip install 'reinforge[marl]'") from None
    try:
        return importlib.import_module(env_id)
    except ImportError as e:
        hint = " (the MPE tasks need mpe2: pip install 'reinforge[marl]')" if env_id.startswith("mpe2") else ""
        raise ConfigError(f"classic.env.id: cannot import PettingZoo environment module {env_id!r}: {e}{hint}") from None


def make_parallel_env(env_id: str, backend: str, kwargs: dict[str, Any]) -> Any:
    """One PettingZoo parallel environment: the module's ``parallel_env``, or its AEC ``env`` converted."""
    module = _module(env_id)
    if backend == MULTI_AGENT_BACKENDS[1]:
        from pettingzoo.utils.conversions import aec_to_parallel

        if not hasattr(module, "env"):
            raise ConfigError(f"classic.env.id: {env_id!r} has no AEC env()")
        return aec_to_parallel(module.env(**kwargs))
    if not hasattr(module, "parallel_env"):
        raise ConfigError(f"classic.env.id: {env_id!r} has no parallel_env() (backend pettingzoo_aec converts its env())")
    return module.parallel_env(**kwargs)


class MultiAgentVecEnv:
    """``num_envs`` copies of a PettingZoo parallel environment, stepped in turn (see the module docstring)."""

    def __init__(self, env_id: str, backend: str, num_envs: int, kwargs: dict[str, Any]) -> None:
        from gymnasium.spaces import Box, Discrete, MultiDiscrete

        self.games = [make_parallel_env(env_id, backend, kwargs) for _ in range(num_envs)]
        first = self.games[0]
        self.agent_names: list[str] = list(first.possible_agents)
        self.num_envs, self.n_agents = num_envs, len(self.agent_names)
        spaces = [first.action_space(a) for a in self.agent_names]
        if not all(isinstance(s, Discrete) for s in spaces) or len({int(s.n) for s in spaces}) != 1:
            raise ConfigError(f"classic.env.id: {env_id!r}: the multi-agent agents need every agent to have a "
                              f"Discrete action space of one size (got {spaces}; MPE: continuous_actions=False)")
        self.n_actions = int(spaces[0].n)
        widths = [int(np.prod(first.observation_space(a).shape)) for a in self.agent_names]
        self.obs_dim = max(widths)
        self.has_state = hasattr(first, "state_space")
        self.state_dim = int(np.prod(first.state_space.shape)) if self.has_state else self.n_agents * self.obs_dim
        self.single_observation_space = Box(-np.inf, np.inf, (self.n_agents * self.obs_dim,), np.float32)
        self.single_action_space = MultiDiscrete([self.n_actions] * self.n_agents)
        self.returns = np.zeros((num_envs, self.n_agents))
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.obs = np.zeros((num_envs, self.n_agents, self.obs_dim), np.float32)

    def _pad(self, obs: dict[str, Any]) -> np.ndarray:
        out = np.zeros((self.n_agents, self.obs_dim), np.float32)
        for i, name in enumerate(self.agent_names):
            if name in obs:
                flat = np.asarray(obs[name], np.float32).reshape(-1)
                out[i, :flat.size] = flat
        return out

    def _state(self, k: int, obs: np.ndarray) -> np.ndarray:
        if self.has_state:
            return np.asarray(self.games[k].state(), np.float32).reshape(-1)
        return obs.reshape(-1)

    def states(self) -> np.ndarray:
        """The global state of every environment now, [E, S]."""
        return np.stack([self._state(k, self.obs[k]) for k in range(self.num_envs)])

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every environment (environment k seeded ``seed + k``)."""
        for k, game in enumerate(self.games):
            obs, _ = game.reset(seed=None if seed is None else seed + k)
            self.obs[k] = self._pad(obs)
        self.returns[:] = 0.0
        self.lengths[:] = 0
        return self.obs.copy(), {"state": self.states()}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """One step of every environment with ``actions`` [E, N]; ended episodes reset in the same step."""
        actions = np.asarray(actions).reshape(self.num_envs, self.n_agents)
        e, n = self.num_envs, self.n_agents
        rewards = np.zeros((e, n), np.float32)
        terminated, truncated = np.zeros(e, bool), np.zeros(e, bool)
        ended = np.zeros(e, bool)
        final_obs = np.empty(e, dtype=object)
        final_state = np.zeros((e, self.state_dim), np.float32)
        episode = {"r": np.zeros(e), "l": np.zeros(e, dtype=np.int64), "agent_r": np.zeros((e, n))}
        for k, game in enumerate(self.games):
            act = {a: int(actions[k, i]) for i, a in enumerate(self.agent_names) if a in game.agents}
            obs, rew, term, trunc, _ = game.step(act)
            rewards[k] = [float(rew.get(a, 0.0)) for a in self.agent_names]
            self.returns[k] += rewards[k]
            self.lengths[k] += 1
            self.obs[k] = self._pad(obs)
            if not game.agents:
                ended[k], truncated[k] = True, any(trunc.values())
                terminated[k] = not truncated[k]
                final_obs[k], final_state[k] = self.obs[k].copy(), self._state(k, self.obs[k])
                episode["r"][k], episode["l"][k] = self.returns[k].mean(), self.lengths[k]
                episode["agent_r"][k] = self.returns[k]
                self.returns[k], self.lengths[k] = 0.0, 0
                new, _ = game.reset()
                self.obs[k] = self._pad(new)
        info: dict[str, Any] = {"state": self.states()}
        if ended.any():
            info.update({"final_obs": final_obs, "_final_obs": ended, "final_state": final_state,
                         "final_info": {"episode": episode, "_episode": ended}})
        return self.obs.copy(), rewards, terminated, truncated, info

    def close(self) -> None:
        for game in self.games:
            game.close()


def make_marl_vec_env(cfg: Any, seed: int, num_envs: int | None = None) -> MultiAgentVecEnv:
    """``classic.env`` (backend pettingzoo / pettingzoo_aec) as a ``MultiAgentVecEnv``, reset with ``seed``."""
    envs = MultiAgentVecEnv(cfg.id, cfg.backend, num_envs or cfg.num_envs, cfg.kwargs)
    envs.reset(seed=seed)
    return envs


def multi_agent_envs(envs: Any, agent: str) -> MultiAgentVecEnv:
    """``envs`` if it is a multi-agent vector environment, else an error that names the setting to change."""
    if not isinstance(envs, MultiAgentVecEnv):
        raise ConfigError(f"classic.agent: {agent} is a multi-agent agent: set classic.env.backend: pettingzoo "
                          "and classic.env.id to a PettingZoo module (e.g. mpe2.simple_spread_v3)")
    return envs
