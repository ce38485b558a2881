"""A uniform replay buffer for off-policy agents, fed through per-environment n-step accumulators.

``NStep`` turns one environment's stream of (s, a, r, s', terminated, truncated) into n-step
transitions (s_t, a_t, R_t^(k), s_{t+k}, terminated, gamma^k): a transition leaves once n rewards are
summed, and at an episode end every pending one leaves with the rewards it has (k < n). A terminated
episode's transitions carry ``terminated`` (no bootstrap); a truncated one's (a time limit) bootstrap
from the last observation, as do all transitions cut by n. With n = 1 this is plain 1-step DQN.
``Replay`` stores transitions in a ring of fixed capacity and samples uniformly with its own seeded
generator (Lin 1992; DQN's experience replay, Mnih et al. 2015).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from reinforge.algo.qlearning import n_step_return


class Replay:
    """``capacity`` transitions; actions are integers (``action_dim`` 0) or float vectors of ``action_dim``."""

    def __init__(self, capacity: int, obs_dim: int, seed: int, action_dim: int = 0) -> None:
        self.capacity, self.size, self.pos = capacity, 0, 0
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = (np.zeros(capacity, dtype=np.int64) if action_dim == 0
                        else np.zeros((capacity, action_dim), dtype=np.float32))
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.discounts = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.rng = np.random.default_rng(seed)

    def add(self, obs: np.ndarray, action: int | np.ndarray, reward: float, next_obs: np.ndarray, terminated: bool,
            discount: float) -> None:
        i = self.pos
        self.obs[i], self.actions[i], self.rewards[i] = obs, action, reward
        self.next_obs[i], self.terminated[i], self.discounts[i] = next_obs, float(terminated), discount
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def add_batch(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
                  terminated: np.ndarray, discount: float) -> None:
        """N transitions at once (model rollouts), written around the ring (the oldest overwritten)."""
        n = len(obs)
        if n > self.capacity:  # only the newest fit
            obs, actions, rewards, next_obs, terminated = (a[n - self.capacity:] for a in
                                                           (obs, actions, rewards, next_obs, terminated))
            n = self.capacity
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx], self.actions[idx], self.rewards[idx] = obs, actions, rewards
        self.next_obs[idx], self.terminated[idx], self.discounts[idx] = next_obs, terminated, discount
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch: int) -> dict[str, np.ndarray]:
        """``batch`` stored transitions drawn uniformly with replacement."""
        idx = self.rng.integers(0, self.size, batch)
        return {"obs": self.obs[idx], "actions": self.actions[idx], "rewards": self.rewards[idx],
                "next_obs": self.next_obs[idx], "terminated": self.terminated[idx], "discounts": self.discounts[idx]}


class NStep:
    """One environment's pending n-step transitions, written to ``replay`` as they complete."""

    def __init__(self, n: int, gamma: float, replay: Replay) -> None:
        self.n, self.gamma, self.replay = n, gamma, replay
        self.pending: deque[tuple[np.ndarray, int | np.ndarray]] = deque()
        self.rewards: deque[float] = deque()

    def step(self, obs: np.ndarray, action: int | np.ndarray, reward: float, next_obs: np.ndarray, terminated: bool,
             truncated: bool) -> None:
        """Record a step; ``next_obs`` is the episode's last observation when it ended here."""
        self.pending.append((obs, action))
        self.rewards.append(reward)
        if terminated or truncated:
            while self.pending:
                self._emit(next_obs, terminated)
        elif len(self.pending) == self.n:
            self._emit(next_obs, False)

    def _emit(self, next_obs: np.ndarray, terminated: bool) -> None:
        obs, action = self.pending.popleft()
        total, discount = n_step_return(list(self.rewards), self.gamma)
        self.rewards.popleft()
        self.replay.add(obs, action, total, next_obs, terminated, discount)


def store_vector_step(accumulators: list[NStep], obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                      next_obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
    """One vector step into each environment's accumulator (``next_obs``: the ended episodes' last
    observations where an episode ended, ``envs.next_observations``)."""
    for i, acc in enumerate(accumulators):
        action = actions[i] if actions.ndim > 1 else int(actions[i])
        acc.step(obs[i], action, float(rewards[i]), next_obs[i], bool(terminated[i]), bool(truncated[i]))
