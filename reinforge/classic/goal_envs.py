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
- ``reinforge/GoalReacher-v0``: Gymnasium's MuJoCo ``Reacher-v5`` arm (two hinge joints, torques in
  [-1, 1]^2, its target drawn uniformly in the disc of radius 0.2 at reset) as a GoalEnv: observation =
  (cos q, sin q, dq/dt) of the two arm joints, without the target; achieved goal = the fingertip's xy;
  desired goal = the target's xy; reward 0 within ``distance_threshold`` of the target, else -1 (the Fetch
  tasks' sparse reward); never terminates, truncated after 50 steps (Reacher's limit). The threshold is
  Fetch's 0.05: Fetch draws goals in a box of half-width 0.15, Reacher in a disc of radius 0.2, so the same
  threshold asks for about the same precision (0.02, the fingertip sphere's radius 0.01 plus the target's
  0.009, asks for touching it; docs/classic.md measures both). Needs ``mujoco`` (imported when made).

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
GOAL_REACHER_ID = "reinforge/GoalReacher-v0"


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


class GoalReacherEnv(gym.Env):
    """Reacher-v5's arm and target as a GoalEnv with the sparse reward -(|fingertip - target| > threshold)."""

    metadata = {"render_modes": ["human", "rgb_array", "depth_array"]}

    def __init__(self, distance_threshold: float = 0.05, **reacher_kwargs: Any) -> None:
        from gymnasium.envs.mujoco.reacher_v5 import ReacherEnv  # needs mujoco: imported only here

        if distance_threshold <= 0:
            raise ValueError(f"distance_threshold must be positive (got {distance_threshold})")
        self.distance_threshold = distance_threshold
        self.reacher = ReacherEnv(**reacher_kwargs)
        self.render_mode = self.reacher.render_mode
        arena = spaces.Box(-0.3, 0.3, (2,), dtype=np.float32)  # inside the arena's walls (the arm reaches 0.21)
        joints = spaces.Box(-np.inf, np.inf, (6,), dtype=np.float32)
        self.observation_space = spaces.Dict({"observation": joints, "achieved_goal": arena, "desired_goal": arena})
        self.action_space = self.reacher.action_space

    def _obs(self) -> dict[str, np.ndarray]:
        """(cos q0, cos q1, sin q0, sin q1, dq0, dq1); the fingertip's and the target's xy (world frame)."""
        q, dq = self.reacher.data.qpos[:2], self.reacher.data.qvel[:2]
        joints = np.concatenate([np.cos(q), np.sin(q), dq]).astype(np.float32)
        return {"observation": joints,
                "achieved_goal": self.reacher.get_body_com("fingertip")[:2].astype(np.float32),
                "desired_goal": self.reacher.get_body_com("target")[:2].astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self.reacher.reset(seed=seed, options=options)  # its own draw of the arm's start and the target
        return self._obs(), {}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        self.reacher.step(np.asarray(action, dtype=np.float64))  # its dense reward is not used
        obs = self._obs()
        reward = float(self.compute_reward(obs["achieved_goal"], obs["desired_goal"], {}))
        distance = float(np.linalg.norm(obs["achieved_goal"] - obs["desired_goal"]))
        return obs, reward, False, False, {"is_success": reward == 0.0, "distance": distance}

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        """0 within ``distance_threshold`` (Euclidean), else -1 (batched over leading dimensions)."""
        distance = np.linalg.norm(np.asarray(achieved_goal) - np.asarray(desired_goal), axis=-1)
        return -(distance > self.distance_threshold).astype(np.float32)

    def compute_terminated(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        return np.zeros(np.shape(achieved_goal)[:-1], dtype=bool)

    def render(self) -> Any:
        return self.reacher.render()

    def close(self) -> None:
        self.reacher.close()


def _bit_flipping(n_bits: int = 10, **kwargs: Any) -> gym.Env:
    """The environment with a time limit of ``n_bits`` steps (the paper's episode length)."""
    return gym.wrappers.TimeLimit(BitFlippingEnv(n_bits, **kwargs), max_episode_steps=n_bits)


def register_goal_envs() -> None:
    """Register the ids once (``classic.envs.require_gymnasium`` calls this)."""
    if BIT_FLIPPING_ID not in gym.registry:
        gym.register(BIT_FLIPPING_ID, entry_point=_bit_flipping)
    if POINT_REACH_ID not in gym.registry:
        gym.register(POINT_REACH_ID, entry_point=PointReachEnv, max_episode_steps=50)
    if GOAL_REACHER_ID not in gym.registry:
        gym.register(GOAL_REACHER_ID, entry_point=GoalReacherEnv, max_episode_steps=50)
