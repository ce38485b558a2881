"""Goal-conditioned Gymnasium environments in the GoalEnv convention (a dict observation with
``observation``, ``achieved_goal`` and ``desired_goal``, and ``compute_reward(achieved, desired, info)``
that works on batches), registered as Gymnasium ids so ``classic.env.id`` names them and
``gymnasium.make_vec`` vectorises them (sync or async) like any other:

- ``reinforge/BitFlipping-v0`` (Andrychowicz et al. 2017, "Hindsight Experience Replay",
  arXiv:1707.01495, section 3.1): a state of n bits and a goal of n bits, both uniform at reset; action
  i flips bit i; reward 0 when the state equals the goal after the step, else -1; the episode
  terminates on success and is truncated after n steps. Option ``n_bits`` (``classic.env.kwargs``).
- ``reinforge/PointReach-v0``: a point in [-1, 1]^2 moved by ``0.1 * action`` (action in [-1, 1]^2,
  the position clipped to the square), a goal uniform in the square; reward 0 within ``tolerance``
  (0.1) of the goal, else -1 (the sparse reward of the Fetch tasks); never terminates, truncated after
  50 steps. ``info["is_success"]`` as in Gymnasium-Robotics.

``compute_terminated(achieved, desired, info)`` says which (relabelled) transitions end the episode;
the hindsight replay (``classic/her.py``) recomputes rewards and terminations with these functions.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

BIT_FLIPPING_ID = "reinforge/BitFlipping-v0"
POINT_REACH_ID = "reinforge/PointReach-v0"


class BitFlippingEnv(gym.Env):
    """n bits, flip one per step; success when the bits equal the goal."""

    def __init__(self, n_bits: int = 10) -> None:
        if n_bits < 1:
            raise ValueError(f"n_bits must be at least 1 (got {n_bits})")
        self.n_bits = n_bits
        bits = spaces.Box(0.0, 1.0, (n_bits,), dtype=np.float32)
        self.observation_space = spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = spaces.Discrete(n_bits)
        self.state = np.zeros(n_bits, dtype=np.float32)
        self.goal = np.zeros(n_bits, dtype=np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.state[int(action)] = 1.0 - self.state[int(action)]
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        success = reward == 0.0
        return obs, reward, success, False, {"is_success": success}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 where every bit matches, else -1 (batched over leading dimensions)."""
        return -(np.asarray(achieved_goal) != np.asarray(desired_goal)).any(-1).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return (np.asarray(achieved_goal) == np.asarray(desired_goal)).all(-1)


class PointReachEnv(gym.Env):
    """A point in the unit square steered to a goal; sparse reward within ``tolerance``."""

    def __init__(self, tolerance: float = 0.1, step_size: float = 0.1) -> None:
        self.tolerance, self.step_size = tolerance, step_size
        square = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.observation_space = spaces.Dict({"observation": square, "achieved_goal": square, "desired_goal": square})
        self.action_space = spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.pos = np.zeros(2, dtype=np.float32)
        self.goal = np.zeros(2, dtype=np.float32)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.pos.copy(), "achieved_goal": self.pos.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        move = self.step_size * np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        self.pos = np.clip(self.pos + move, -1.0, 1.0).astype(np.float32)
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        return obs, reward, False, False, {"is_success": reward == 0.0}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 within ``tolerance`` (Euclidean), else -1 (batched over leading dimensions)."""
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > self.tolerance).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)


def _bit_flipping(n_bits: int = 10, **kwargs: Any) -> gym.Env:
    """The environment with a time limit of ``n_bits`` steps (the paper's episode length)."""
    return gym.wrappers.TimeLimit(BitFlippingEnv(n_bits, **kwargs), max_episode_steps=n_bits)


def register_goal_envs() -> None:
    """Register the ids once (``classic.envs.require_gymnasium`` calls this)."""
    if BIT_FLIPPING_ID not in gym.registry:
        gym.register(BIT_FLIPPING_ID, entry_point=_bit_flipping)
    if POINT_REACH_ID not in gym.registry:
        gym.register(POINT_REACH_ID, entry_point=PointReachEnv, max_episode_steps=50)
