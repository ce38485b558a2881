"""DQN (Mnih et al. 2015, "Human-level control through deep reinforcement learning", Nature 518) on
Gymnasium environments with discrete actions, read top to bottom: act epsilon-greedily, store
transitions, regress Q(s, a) on y = R + (1 - d) g Q_target(s', a*) (``algo/qlearning.py``).

Options: double Q-learning (``double_q``: the online network picks a*, van Hasselt et al. 2016,
arXiv:1509.06461) and n-step returns (``n_step``; Sutton 1988, as in Rainbow, Hessel et al. 2018,
arXiv:1710.02298); the loss is MSE (CleanRL's dqn.py) or Huber (SB3, ``loss: huber``). The defaults
are CleanRL's ``dqn.py`` (Huang et al. 2022): Adam 2.5e-4, buffer 10,000, batch 128, a hard target
update every 500 environment steps, epsilon 1 -> 0.05 over half the run, learning from step 10,000,
one gradient step every 10 vector steps, a 120-84 ReLU MLP. Counting: ``learning_starts`` and
``target_update_interval`` are environment steps over all environments (as CleanRL's global_step);
one iteration is ``train_frequency`` vector steps followed by ``gradient_steps`` gradient steps.
Time limits: a truncated episode bootstraps from its last observation (``terminated`` only stops it).
"""

from __future__ import annotations

import time
from typing import Any, Literal, Self

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from reinforge.algo.qlearning import q_learning_targets
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.envs import finished_episodes, flat_obs_dim, next_observations, obs_tensor
from reinforge.classic.her import HERSettings, HindsightReplay
from reinforge.classic.networks import action_spec, polyak_update
from reinforge.classic.replay import NStep, Replay, store_vector_step
from reinforge.errors import ConfigError
from reinforge.registry import Settings


class DQNSettings(Settings):
    """DQN's hyper-parameters (CleanRL dqn.py's defaults)."""

    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    buffer_size: int = Field(10_000, ge=1, description="replay capacity (transitions)")
    batch_size: int = Field(128, ge=1, description="transitions per gradient step")
    learning_starts: int = Field(10_000, ge=0, description="environment steps before the first gradient step")
    train_frequency: int = Field(10, ge=1, description="vector steps per iteration")
    gradient_steps: int = Field(1, ge=1, description="gradient steps per iteration")
    target_update_interval: int = Field(500, ge=1, description="environment steps between target updates")
    tau: float = Field(1.0, gt=0, le=1, description="target update: theta' <- tau theta + (1 - tau) theta' (1 = copy)")
    start_e: float = Field(1.0, ge=0, le=1, description="initial exploration epsilon")
    end_e: float = Field(0.05, ge=0, le=1, description="final exploration epsilon")
    exploration_fraction: float = Field(0.5, gt=0, le=1, description="share of the run over which epsilon decays")
    double_q: bool = Field(False, description="double Q-learning: the online network picks the next action")
    n_step: int = Field(1, ge=1, description="rewards summed before bootstrapping")
    loss: Literal["mse", "huber"] = Field("mse", description="regression loss on the TD error")
    max_grad_norm: float | None = Field(None, gt=0, description="global gradient-norm clip (None = none)")
    hidden: list[int] = Field(default_factory=lambda: [120, 84], min_length=1, description="MLP widths (ReLU)")
    her: HERSettings | None = Field(None, description="hindsight experience replay on a goal environment "
                                    "({strategy: future, k: 4}; classic/her.py); None = off")

    @model_validator(mode="after")
    def _her_one_step(self) -> Self:
        if self.her is not None and self.n_step != 1:
            raise ValueError("her relabels 1-step transitions: n_step must be 1")
        return self


def q_network(obs_dim: int, hidden: list[int], actions: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(obs_dim, width), nn.ReLU()]
        obs_dim = width
    return nn.Sequential(*layers, nn.Linear(obs_dim, actions))


@CLASSIC_AGENTS.register(
    "dqn", formula="min E[(Q(s, a) - (R + (1 - d) gamma^k Q_target(s', argmax_a' Q_(online|target)(s', a'))))^2]",
    paper="1312.5602", settings=DQNSettings)
class DQN:
    """The agent: online and target networks, the replay buffer and the environments' observations."""

    def __init__(self, envs: Any, seed: int, cfg: DQNSettings) -> None:
        self.cfg, self.envs = cfg, envs
        spec = action_spec(envs.single_action_space)
        if not spec.discrete:
            raise ConfigError("classic.agent: dqn needs a Discrete action space; "
                              f"{envs.single_action_space} is not (use ppo)")
        obs_dim, self.n_actions = flat_obs_dim(envs.single_observation_space), spec.n
        torch.manual_seed(seed)
        self.net = q_network(obs_dim, cfg.hidden, spec.n)
        self.target = q_network(obs_dim, cfg.hidden, spec.n)
        self.target.load_state_dict(self.net.state_dict())
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.replay = Replay(cfg.buffer_size, obs_dim, seed)
        self.nstep = [NStep(cfg.n_step, cfg.gamma, self.replay) for _ in range(envs.num_envs)]
        self.her = HindsightReplay(cfg.her, self.replay, envs, cfg.gamma, seed) if cfg.her is not None else None
        self.steps_per_iteration = cfg.train_frequency * envs.num_envs
        self.env_steps, self.last_target_update = 0, 0
        obs, _ = envs.reset(seed=seed)
        self.raw_obs, self.obs = obs, obs_tensor(obs)

    def epsilon(self, progress: float) -> float:
        """Linear from start_e to end_e over the first ``exploration_fraction`` of the run."""
        c = self.cfg
        return c.start_e + (c.end_e - c.start_e) * min(1.0, progress / c.exploration_fraction)

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool, epsilon: float = 0.0) -> Tensor:
        """argmax_a Q(s, a), or with probability ``epsilon`` (never if ``deterministic``) a uniform action."""
        greedy = self.net(obs).argmax(-1)
        if deterministic or epsilon <= 0:
            return greedy
        explore = torch.rand(greedy.shape, generator=self.generator) < epsilon
        random = torch.randint(self.n_actions, greedy.shape, generator=self.generator)
        return torch.where(explore, random, greedy)

    def _env_step(self, epsilon: float) -> list[tuple[float, int]]:
        action = self.act(self.obs, False, epsilon)
        obs, reward, terminated, truncated, info = self.envs.step(action.numpy())
        if self.her is not None:
            self.her.store_vector_step(self.raw_obs, action.numpy(), reward, obs, info, terminated, truncated)
        else:
            store_vector_step(self.nstep, self.obs.numpy(), action.numpy(), reward, next_observations(obs, info),
                              terminated, truncated)
        self.raw_obs, self.obs = obs, obs_tensor(obs)
        self.env_steps += self.envs.num_envs
        return finished_episodes(info)

    def iterate(self, progress: float) -> Iteration:
        """``train_frequency`` vector steps, then (after ``learning_starts``) ``gradient_steps`` updates."""
        t0, eps = time.perf_counter(), self.epsilon(progress)
        episodes: list[tuple[float, int]] = []
        for _ in range(self.cfg.train_frequency):
            episodes += self._env_step(eps)
        rollout_s = time.perf_counter() - t0
        metrics: dict[str, float] = {"train/epsilon": eps, "train/replay_size": float(self.replay.size)}
        if self.env_steps >= self.cfg.learning_starts and self.replay.size >= self.cfg.batch_size:
            sums: dict[str, float] = {}
            for _ in range(self.cfg.gradient_steps):
                for k, v in self.gradient_step(self.replay.sample(self.cfg.batch_size)).items():
                    sums[k] = sums.get(k, 0.0) + v / self.cfg.gradient_steps
            metrics.update(sums)
        if self.env_steps - self.last_target_update >= self.cfg.target_update_interval:
            self._update_target()
            self.last_target_update = self.env_steps
        return Iteration(episodes, metrics, rollout_s)

    def gradient_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """One regression step of Q(s, a) on the (double-)Q target."""
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        q = self.net(t["obs"]).gather(-1, t["actions"].unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():
            online = self.net(t["next_obs"]) if self.cfg.double_q else None
            y = q_learning_targets(t["rewards"], t["discounts"], t["terminated"], self.target(t["next_obs"]), online)
        loss = nn.functional.mse_loss(q, y) if self.cfg.loss == "mse" else nn.functional.smooth_l1_loss(q, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        return {"train/td_loss": loss.item(), "train/q_mean": q.mean().item()}

    def _update_target(self) -> None:
        polyak_update(self.target, self.net, self.cfg.tau)
