"""What the offline agents for Box actions share (classic/td3bc.py, cql_box.py, wsrl.py's pretraining): the
logged dataset (classic/offline.py's Parquet columns, Box actions as lists: ``collect_box``) as tensors with
uniform mini-batches, each step's Monte-Carlo return-to-go (Cal-QL's reference), and the Box's bounds.

An offline agent takes no environment step. In a run (classic/run.py) one iteration is ``iteration_steps``
gradient steps on the logged data, one ``metrics.jsonl`` record, so ``train.total_env_steps`` counts
gradient steps for these agents; the final evaluation plays the environment as for any agent.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.offline_rl import discounted_returns_to_go
from reinforge.classic.agents import Iteration
from reinforge.classic.envs import flat_obs_dim
from reinforge.classic.networks import action_spec
from reinforge.classic.offline import Logged, load_parquet
from reinforge.errors import ConfigError
from reinforge.registry import Settings


class OfflineBoxSettings(Settings):
    """The options every offline Box-action agent has."""

    offline_data: str = Field("", description="the logged dataset (Parquet, classic/offline.py's columns; Box "
                              "actions as lists, collect_box); required")
    iteration_steps: int = Field(1000, ge=1, description="gradient steps per iteration (one metrics record); the "
                                 "run's total_env_steps counts gradient steps for an offline agent")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    tau: float = Field(0.005, gt=0, le=1, description="target networks: phi' <- tau phi + (1 - tau) phi'")
    batch_size: int = Field(256, ge=1, description="logged transitions per gradient step")
    hidden: list[int] = Field(default_factory=lambda: [256, 256], min_length=1, description="MLP widths (ReLU)")


class LoggedTensors:
    """A logged dataset as tensors: obs, next_obs [S, D], actions [S, A], rewards, terminated (no bootstrap) and
    returns_to_go [S] (discounted within each logged episode, nothing after its last step)."""

    def __init__(self, data: Logged, gamma: float, seed: int) -> None:
        n = len(data.reward)
        self.obs, self.next_obs = torch.from_numpy(data.obs).float(), torch.from_numpy(data.next_obs).float()
        self.actions = torch.as_tensor(np.asarray(data.action, dtype=np.float32)).reshape(n, -1)
        self.rewards = torch.as_tensor(data.reward, dtype=torch.float32)
        self.terminated = torch.as_tensor(data.terminated, dtype=torch.float32)
        ends = np.append(data.episode[1:] != data.episode[:-1], True) | data.terminated | data.truncated
        self.returns_to_go = discounted_returns_to_go(self.rewards.double(), torch.as_tensor(ends), gamma).float()
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.rewards)

    def sample(self, batch: int) -> dict[str, Tensor]:
        """``batch`` steps drawn uniformly with replacement."""
        i = torch.from_numpy(self.rng.integers(0, len(self), batch))
        return {"obs": self.obs[i], "actions": self.actions[i], "rewards": self.rewards[i],
                "next_obs": self.next_obs[i], "terminated": self.terminated[i], "returns_to_go": self.returns_to_go[i]}


def bounded_box(envs: Any, agent: str) -> tuple[np.ndarray, np.ndarray]:
    """The (low, high) of the environments' Box actions; a ConfigError naming ``agent`` otherwise."""
    if action_spec(envs.single_action_space).discrete:
        raise ConfigError(f"classic.agent: {agent} needs a Box action space; {envs.single_action_space} is not "
                          "(discrete offline RL: classic/cql.py, classic/iql.py)")
    space = getattr(envs, "bounded_action_space", envs.single_action_space)
    low, high = np.asarray(space.low, dtype=np.float32).ravel(), np.asarray(space.high, dtype=np.float32).ravel()
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigError(f"classic.agent: {agent} squashes actions into the Box's bounds; {space} has none")
    return low, high


def load_logged(path: str, envs: Any, gamma: float, seed: int) -> LoggedTensors:
    """The dataset at ``path`` checked against the environments' observation and action widths."""
    if not path or not Path(path).is_file():
        raise ConfigError(f"classic.agent.offline_data: no logged dataset at {path!r} "
                          "(a Parquet file of classic/offline.py's columns)")
    data = LoggedTensors(load_parquet(path), gamma, seed + 1)
    obs_dim, act_dim = flat_obs_dim(envs.single_observation_space), action_spec(envs.single_action_space).dim
    if data.obs.shape[1] != obs_dim or data.actions.shape[1] != act_dim:
        raise ConfigError(f"classic.agent.offline_data: observations x actions {data.obs.shape[1]} x "
                          f"{data.actions.shape[1]}, the environment's {obs_dim} x {act_dim}")
    return data


class OfflineIterations:
    """``iterate`` for an agent with ``data`` (LoggedTensors), ``cfg`` (OfflineBoxSettings) and ``gradient_step``."""

    cfg: Any
    data: LoggedTensors

    def gradient_step(self, batch: dict[str, Tensor]) -> dict[str, float]:
        raise NotImplementedError

    def iterate(self, progress: float) -> Iteration:
        """``iteration_steps`` gradient steps on uniform batches of the logged data (no episodes)."""
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        for _ in range(self.cfg.iteration_steps):
            metrics = self.gradient_step(self.data.sample(self.cfg.batch_size))
        metrics["time/update_s"] = time.perf_counter() - t0
        return Iteration([], metrics, 0.0)
