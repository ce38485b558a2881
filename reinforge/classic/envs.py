"""Gymnasium environments for the classic agents: any registered id, vectorised with Gymnasium's vector
API (``gymnasium.make_vec``, sync or async), with Gymnasium's own wrappers on each environment (as
CleanRL's ``make_env``): ``RecordEpisodeStatistics`` always, ``ClipAction`` for Box actions (the agent
keeps the unclipped sample and its log-prob), optionally ``NormalizeObservation`` and
``NormalizeReward``, each followed by a clip (``TransformObservation`` / ``TransformReward``), and
``FrameStackObservation`` (``frame_stack``: the last k observations, after normalisation, flattened).

The vector environment resets a finished environment in the same step (``AutoresetMode.SAME_STEP``):
the step that ends an episode returns the next episode's first observation, the finished one's last
observation in ``info["final_obs"]`` (the agent bootstraps a truncated episode from it) and its
statistics in ``info["final_info"]["episode"]``. Environment i is seeded ``seed + i`` at the first
reset; the action space with ``seed``.

``backend: envpool`` steps EnvPool's C++ environments instead, behind the same contract
(``classic/envpool_env.py``: same-step autoreset, the same episode statistics, ClipAction); ``auto``
takes EnvPool when it is installed and has the id and no Gymnasium-only wrapper is asked for.
``backend: pettingzoo`` (or ``pettingzoo_aec``) makes PettingZoo multi-agent environments instead
(``classic/marl_envs.py``), for the multi-agent agents.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.classic.marl_envs import MULTI_AGENT_BACKENDS
from reinforge.errors import ConfigError, ReinforgeError
from reinforge.registry import Settings

FIXED_BACKENDS = ("gymnasium", "envpool", "pettingzoo", "pettingzoo_aec")  # classic.env.backend values that
# need no decision (the other: auto); the pettingzoo ones are classic/marl_envs.py's multi-agent environments


class EnvConfig(Settings):
    """``classic.env``: which Gymnasium environment, how many, and the wrappers."""

    id: str = Field("CartPole-v1", min_length=1, description="any registered Gymnasium environment id (with backend "
                    "pettingzoo: a PettingZoo environment module, e.g. mpe2.simple_spread_v3)")
    num_envs: int = Field(4, ge=1, description="environments stepped together (Gymnasium's vector API)")
    vectorization: Literal["sync", "async"] = Field("sync", description="sync (one process) or async "
                               "(a process per environment)")
    normalize_obs: bool = Field(False, description="gymnasium.wrappers.NormalizeObservation per environment")
    normalize_reward: bool = Field(False, description="gymnasium.wrappers.NormalizeReward per environment "
                                   "(scales by the std of a discounted return, gamma = ppo.gamma)")
    clip_obs: float = Field(10.0, gt=0, description="clip normalised observations to [-clip_obs, clip_obs]")
    clip_reward: float = Field(10.0, gt=0, description="clip normalised rewards to [-clip_reward, clip_reward]")
    frame_stack: int = Field(1, ge=1, description="observations stacked (gymnasium.wrappers.FrameStackObservation, "
                             "padded at reset with the first one; flattened for the MLPs); 1 = off")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of gymnasium.make "
                                   "(of envpool.make_gymnasium with backend envpool)")
    backend: Literal["gymnasium", "envpool", "auto", "pettingzoo", "pettingzoo_aec"] = Field(
        "gymnasium", description="gymnasium (Python environments, Gymnasium's vector API), envpool (EnvPool's "
        "C++ environments, same contract; no normalisation or frame stacking), auto (envpool where installed "
        "and it has the id and no Gymnasium-only wrapper is set, else gymnasium), pettingzoo / pettingzoo_aec "
        "(a PettingZoo module's parallel_env / AEC env, id e.g. mpe2.simple_spread_v3, for the multi-agent "
        "agents; classic/marl_envs.py)")

    @model_validator(mode="after")
    def _statistics_readable(self) -> EnvConfig:
        if self.normalize_obs and self.vectorization == "async":
            raise ValueError("normalize_obs needs vectorization: sync (the evaluation and the checkpoints read "
                             "the observation statistics from the environments in this process)")
        if self.backend in MULTI_AGENT_BACKENDS and (self.gymnasium_only() or self.vectorization == "async"):
            raise ValueError(f"backend {self.backend} steps its environments in this process with no wrappers: "
                             "unset normalize_obs, normalize_reward, frame_stack and vectorization async")
        if self.backend == "envpool":
            if self.gymnasium_only():
                raise ValueError(f"backend envpool has no {self.gymnasium_only()[0]} (Gymnasium's per-environment "
                                 "wrappers do not wrap EnvPool's C++ environments): use backend gymnasium")
            if self.vectorization == "async":
                raise ValueError("vectorization async is Gymnasium's; backend envpool steps its pool in this process")
        return self

    def gymnasium_only(self) -> list[str]:
        """The fields set here that only the Gymnasium backend provides."""
        return [name for name, on in (("normalize_obs", self.normalize_obs), ("normalize_reward", self.normalize_reward),
                                      ("frame_stack", self.frame_stack > 1)) if on]

    def resolved_backend(self) -> str:
        """``backend``, with ``auto`` decided: envpool if installed, it has ``id`` and no Gymnasium-only
        wrapper is set."""
        if self.backend in FIXED_BACKENDS:
            return self.backend
        from reinforge.classic.envpool_env import envpool_has

        usable = not self.gymnasium_only() and self.vectorization == "sync" and envpool_has(self.id)
        return "envpool" if usable else "gymnasium"


def require_gymnasium() -> ModuleType:
    """``gymnasium``, or an error that says how to install it."""
    try:
        import gymnasium
    except ImportError:
        raise ReinforgeError("classic RL needs gymnasium: pip install 'reinforge[classic]'") from None
    from reinforge.classic.goal_envs import register_goal_envs

    register_goal_envs()
    return gymnasium


def _clip_action(env: Any) -> Any:
    from gymnasium.spaces import Box
    from gymnasium.wrappers import ClipAction

    return ClipAction(env) if isinstance(env.action_space, Box) else env


def _normalize_obs(env: Any, clip: float) -> Any:
    from gymnasium.wrappers import NormalizeObservation, TransformObservation

    env = NormalizeObservation(env)
    return TransformObservation(env, lambda o: np.clip(o, -clip, clip), env.observation_space)


def _normalize_reward(env: Any, gamma: float, clip: float) -> Any:
    from gymnasium.wrappers import NormalizeReward, TransformReward

    return TransformReward(NormalizeReward(env, gamma=gamma), lambda r: float(np.clip(r, -clip, clip)))


def _frame_stack(env: Any, size: int) -> Any:
    from gymnasium.wrappers import FlattenObservation, FrameStackObservation

    return FlattenObservation(FrameStackObservation(env, size))


def env_wrappers(cfg: EnvConfig, gamma: float) -> list[Callable[[Any], Any]]:
    """The wrappers of each environment, innermost first."""
    from gymnasium.wrappers import RecordEpisodeStatistics

    out: list[Callable[[Any], Any]] = [RecordEpisodeStatistics, _clip_action]
    if cfg.normalize_obs:
        out.append(functools.partial(_normalize_obs, clip=cfg.clip_obs))
    if cfg.frame_stack > 1:
        out.append(functools.partial(_frame_stack, size=cfg.frame_stack))
    if cfg.normalize_reward:
        out.append(functools.partial(_normalize_reward, gamma=gamma, clip=cfg.clip_reward))
    return out


def make_vec_env(cfg: EnvConfig, gamma: float, seed: int, num_envs: int | None = None) -> Any:
    """``cfg.num_envs`` (or ``num_envs``) wrapped copies of ``cfg.id`` as one vector environment."""
    gym = require_gymnasium()
    if cfg.backend in MULTI_AGENT_BACKENDS:
        from reinforge.classic.marl_envs import make_marl_vec_env

        return make_marl_vec_env(cfg, seed, num_envs)
    if cfg.resolved_backend() == "envpool":
        from reinforge.classic.envpool_env import make_envpool_env

        envs = make_envpool_env(cfg.id, num_envs or cfg.num_envs, seed, cfg.kwargs)
        envs.action_space.seed(seed)
        return envs
    from gymnasium.vector import AutoresetMode

    try:
        envs = gym.make_vec(cfg.id, num_envs=num_envs or cfg.num_envs, vectorization_mode=cfg.vectorization,
                            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                            wrappers=env_wrappers(cfg, gamma), **cfg.kwargs)
    except gym.error.Error as e:
        raise ConfigError(f"classic.env.id: cannot make {cfg.id!r}: {e}") from None
    envs.action_space.seed(seed)
    bare = gym.make(cfg.id, **cfg.kwargs)  # ClipAction widens a Box to (-inf, inf): keep the real bounds
    envs.bounded_action_space = bare.action_space
    if hasattr(bare.unwrapped, "compute_reward"):  # a goal environment: its reward function, for HER (her.py)
        envs.goal_env = bare.unwrapped
    bare.close()
    return envs


def finished_episodes(info: dict[str, Any]) -> list[tuple[float, int]]:
    """(return, length) of every episode that ended in this step (``RecordEpisodeStatistics``; the
    returns are the environment's own rewards, before any reward normalisation)."""
    final = info.get("final_info") or {}
    stats = final.get("episode")
    if stats is None:
        return []
    done = np.asarray(final.get("_episode", np.ones(len(stats["r"]), dtype=bool)))
    return [(float(r), int(n)) for r, n, d in zip(stats["r"], stats["l"], done, strict=True) if d]


def finished_successes(info: dict[str, Any]) -> list[bool]:
    """``is_success`` at the last step of every episode that ended in this step (a goal environment's
    success, as Gymnasium-Robotics and the HER paper measure it: at the episode's end); [] without one."""
    final = info.get("final_info") or {}
    if "is_success" not in final:
        return []
    done = np.asarray(final.get("_is_success", np.ones(len(final["is_success"]), dtype=bool)))
    return [bool(s) for s, d in zip(final["is_success"], done, strict=True) if d]


def final_observations(info: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the environments whose episode ended in this step and their last observations,
    flattened as the networks see them (``flat_observation``)."""
    mask = info.get("_final_obs")
    if mask is None or not np.any(mask):
        return np.zeros(0, dtype=np.int64), np.zeros((0,))
    index = np.flatnonzero(mask)
    return index, np.stack([flat_observation(info["final_obs"][i]) for i in index])


def next_observations(obs: Any, info: dict[str, Any]) -> np.ndarray:
    """The observations that follow a vector step, [E, D] float32: the returned ones, except where an
    episode ended, its last observation (the returned one already starts the next episode)."""
    out = obs_tensor(obs).numpy().copy()
    index, final = final_observations(info)
    if len(index):
        out[index] = final
    return out


def goal_input(obs: dict[str, Any]) -> np.ndarray:
    """A goal environment's network input, concat(observation, desired goal) on the last axis (HER,
    arXiv:1707.01495: the policy and the value see the state and the goal)."""
    parts = [np.asarray(obs["observation"], dtype=np.float32), np.asarray(obs["desired_goal"], dtype=np.float32)]
    lead = parts[0].shape[:-1] if parts[0].ndim > 1 else parts[0].shape[:0]
    return np.concatenate([p.reshape(*lead, -1) for p in parts], -1)


def flat_observation(obs: Any) -> np.ndarray:
    """One environment's observation as the flat float32 vector the networks see."""
    if isinstance(obs, dict):
        return goal_input(obs).reshape(-1)
    return np.asarray(obs, dtype=np.float32).reshape(-1)


def flat_obs_dim(space: Any) -> int:
    """The width of ``flat_observation`` for one environment's observation space."""
    if hasattr(space, "spaces") and "desired_goal" in space.spaces:
        return int(np.prod(space["observation"].shape)) + int(np.prod(space["desired_goal"].shape))
    return int(np.prod(space.shape))


def obs_tensor(obs: Any) -> Tensor:
    """A batch of observations as a float32 [B, D] tensor (each observation flattened; a goal
    environment's dict batch as concat(observation, desired goal))."""
    array = goal_input(obs) if isinstance(obs, dict) else np.asarray(obs, dtype=np.float32)
    return torch.from_numpy(np.ascontiguousarray(array.reshape(array.shape[0], -1)))


def obs_normalizers(envs: Any) -> list[Any]:
    """The ``NormalizeObservation`` wrapper of each environment of a sync vector env (empty without)."""
    from gymnasium.wrappers import NormalizeObservation

    found = []
    for env in getattr(envs, "envs", []):
        while env is not None and not isinstance(env, NormalizeObservation):
            env = getattr(env, "env", None)
        if env is not None:
            found.append(env)
    return found
