"""EnvPool's C++ vector environments (Weng et al. 2022, "EnvPool: A Highly Parallel Reinforcement Learning
Environment Execution Engine", arXiv:2206.10558) behind the contract of the Gymnasium path
(``classic/envs.py``), so the agents cannot tell the two apart:

- **Same-step autoreset.** EnvPool resets a finished environment on the *next* step: that step
  ignores the action, returns the new episode's first observation with reward 0 and
  terminated = truncated = False. The agents expect Gymnasium's ``AutoresetMode.SAME_STEP``, so the
  step that ends an episode is followed at once by ``pool.reset(env_ids)`` of the finished
  environments (EnvPool resets a subset in sync mode): the step returns the new first observation,
  the last one in ``info["final_obs"]`` (mask ``info["_final_obs"]``), and no step is ever a dummy.
- **Episode statistics** as ``RecordEpisodeStatistics`` records them: the sum of the environment's
  rewards and the number of steps of each episode, in ``info["final_info"]["episode"]`` (``r``, ``l``,
  ``t``, each with its ``_r``/``_l``/``_t`` mask) and ``info["final_info"]["_episode"]``.
- **ClipAction** for Box actions: the step clips an action to the bounds (the agent keeps the
  unclipped sample); ``bounded_action_space`` is the real Box.

Observations are float32 [E, D] (EnvPool's dtype kept otherwise). Environment ``i`` is seeded by
EnvPool at construction (``seed + i``); ``reset(seed=s)`` takes only that seed. The normalisation and
frame-stacking wrappers are not available on this backend (``classic.env`` rejects them).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def require_envpool() -> Any:
    """``envpool``, or an error that names the field that asked for it."""
    from reinforge.errors import ConfigError

    try:
        import envpool
    except ImportError:
        raise ConfigError("classic.env.backend: envpool is not installed (pip install envpool; or "
                          "backend: gymnasium / auto)") from None
    return envpool


def envpool_has(env_id: str) -> bool:
    """Whether ``envpool`` is importable and has ``env_id``."""
    try:
        import envpool
    except ImportError:
        return False
    return env_id in envpool.list_all_envs()


class EnvPoolVectorEnv:
    """A sync EnvPool pool with same-step autoreset, episode statistics and ClipAction (module doc)."""

    def __init__(self, pool: Any, seed: int) -> None:
        from gymnasium.spaces import Box
        from gymnasium.vector.utils import batch_space

        self.pool, self.seed = pool, seed
        self.num_envs = int(pool.config["num_envs"])
        self.single_observation_space = pool.single_observation_space
        self.single_action_space = self.bounded_action_space = pool.single_action_space
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        box = self.single_action_space
        self._clip = (box.low, box.high) if isinstance(box, Box) else None
        self._return = np.zeros(self.num_envs, dtype=np.float64)
        self._length = np.zeros(self.num_envs, dtype=np.int64)
        self._start = np.zeros(self.num_envs, dtype=np.float64)

    def _ordered(self, out: tuple[Any, ...], info: dict[str, Any]) -> tuple[Any, ...]:
        """The pool's arrays in environment order (EnvPool reports ``info["env_id"]`` per row)."""
        order = np.argsort(np.asarray(info["env_id"]), kind="stable")
        return tuple(np.asarray(x)[order] for x in out)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None and seed != self.seed:
            raise ValueError(f"an EnvPool environment is seeded when it is made (seed {self.seed}), not at reset ({seed})")
        obs, info = self.pool.reset()
        (obs,) = self._ordered((obs,), info)
        self._return[:], self._length[:], self._start[:] = 0.0, 0, time.perf_counter()
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        action = np.asarray(action)
        if self._clip is not None:
            action = np.clip(action, *self._clip)
        obs, reward, terminated, truncated, info = self.pool.step(action)
        obs, reward, terminated, truncated = self._ordered((obs, reward, terminated, truncated), info)
        self._return += reward
        self._length += 1
        done = terminated | truncated
        if not done.any():
            return obs, reward, terminated, truncated, {}
        return obs, reward, terminated, truncated, self._finish(obs, done)

    def _finish(self, obs: np.ndarray, done: np.ndarray) -> dict[str, Any]:
        """Reset the finished environments now; their last observations and statistics -> info."""
        index = np.flatnonzero(done)
        final_obs = np.empty(self.num_envs, dtype=object)
        final_obs[:] = None
        for i in index:
            final_obs[i] = obs[i].copy()
        now = time.perf_counter()
        zero, flat = np.zeros(self.num_envs), np.zeros(self.num_envs, dtype=np.int64)
        r, n, t = zero.copy(), flat, zero.copy()
        r[index], n[index], t[index] = self._return[index], self._length[index], np.round(now - self._start[index], 6)
        first, reset_info = self.pool.reset(index.astype(np.int32))
        obs[np.asarray(reset_info["env_id"])] = first
        self._return[index], self._length[index], self._start[index] = 0.0, 0, now
        episode = {"r": r, "_r": done.copy(), "l": n, "_l": done.copy(), "t": t, "_t": done.copy()}
        return {"final_obs": final_obs, "_final_obs": done.copy(),
                "final_info": {"episode": episode, "_episode": done.copy()}, "_final_info": done.copy()}

    def close(self) -> None:
        self.pool.close()


def make_envpool_env(env_id: str, num_envs: int, seed: int, kwargs: dict[str, Any]) -> EnvPoolVectorEnv:
    """``num_envs`` copies of ``env_id`` in one sync EnvPool pool on one worker thread (the agents step
    it from one process; ``kwargs`` go to ``envpool.make_gymnasium``)."""
    from reinforge.errors import ConfigError

    envpool = require_envpool()
    if env_id not in envpool.list_all_envs():
        raise ConfigError(f"classic.env.id: EnvPool has no {env_id!r} (classic.env.backend: envpool)")
    options = {"num_threads": 1} | dict(kwargs)
    try:
        pool = envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed, **options)
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"classic.env.kwargs: EnvPool cannot make {env_id!r}: {e}") from None
    return EnvPoolVectorEnv(pool, seed)
