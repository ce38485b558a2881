"""RLPD (Ball, Smith, Kostrikov & Levine 2023, "Efficient Online Reinforcement Learning with Offline Data",
arXiv:2302.02948): SAC that learns online from the first step with a logged dataset beside its replay, no
pretraining and no behaviour-cloning term. Read top to bottom: the settings, the offline data as a replay
(``offline_replay``), the symmetric batch (``symmetric_batch``), the agent.

    batch:   n_off = round(ratio N) transitions uniformly from the offline data, N - n_off from the online replay
    critic:  min_phi sum_e E[(Q_e(s, a) - y)^2],  y = r + (1 - d) g (min_{e in Z} Q'_e(s', a') - [backup] alpha log pi(a'|s'))
             Z: a fresh random subset of M of the E target critics per critic step (REDQ, arXiv:2101.05982)
    actor:   min_theta E[alpha log pi(a~|s) - mean_e Q_e(s, a~)]
    alpha:   min_alpha E[-alpha (log pi(a~|s) + dim(A) / 2)]

G = ``utd`` critic steps (each on its own symmetric batch, targets Polyak-averaged after each) per vector
environment step, then one actor and one alpha step on the last batch. The critics are one batched
ensemble with LayerNorm (classic/ensemble.py). Defaults are the authors' code (github.com/ikostrikov/rlpd,
configs/rlpd_config.py over sac_config.py and train_finetuning.py's flags, the README's locomotion
command): E = 10, M = 2, layer norm, ratio 0.5, UTD 20, lr 3e-4 everywhere, initial alpha 1, target
entropy -dim(A)/2, learning after 5000 steps of uniform random actions. Departures: docs/classic.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from reinforge.algo.qlearning import soft_q_targets
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.ensemble import EnsembleCritic, subset_min
from reinforge.classic.envs import flat_obs_dim
from reinforge.classic.networks import action_spec, polyak_update
from reinforge.classic.offline import Logged, load_parquet
from reinforge.classic.replay import NStep, Replay
from reinforge.classic.sac import SoftActorCore, SquashedGaussian
from reinforge.errors import ConfigError
from reinforge.registry import Settings


class RLPDSettings(Settings):
    """RLPD's options (the authors' rlpd_config.py and train_finetuning.py defaults)."""

    offline_data: str = Field("", description="the logged dataset (Parquet, classic/offline.py's columns; "
                              "Box actions as lists, collect_box); required")
    offline_ratio: float = Field(0.5, ge=0, le=1, description="share of each batch drawn from the offline data")
    ensemble_size: int = Field(10, ge=1, description="E: critics in the ensemble")
    subset_size: int = Field(2, ge=1, description="M: random target critics whose minimum is the target")
    layer_norm: bool = Field(True, description="LayerNorm after each hidden layer of the critics")
    utd: int = Field(20, ge=1, description="G: critic steps per vector environment step (update-to-data ratio)")
    backup_entropy: bool = Field(True, description="subtract alpha log pi(a'|s') in the target (the paper drops it "
                                 "on sparse-reward tasks)")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    tau: float = Field(0.005, gt=0, le=1, description="target critics: phi' <- tau phi + (1 - tau) phi'")
    buffer_size: int = Field(1_000_000, ge=1, description="online replay capacity (transitions)")
    batch_size: int = Field(256, ge=2, description="transitions per critic step (both sources)")
    learning_starts: int = Field(5000, ge=0, description="environment steps of uniform random actions before learning")
    policy_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the actor and alpha")
    q_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the critics")
    alpha: float = Field(1.0, gt=0, description="entropy temperature (the initial one with autotune)")
    autotune: bool = Field(True, description="tune alpha to the target entropy -dim(A)/2")
    hidden: list[int] = Field(default_factory=lambda: [256, 256], min_length=1, description="MLP widths (ReLU)")

    @model_validator(mode="after")
    def _subset_in_ensemble(self) -> Self:
        if self.subset_size > self.ensemble_size:
            raise ValueError(f"subset_size ({self.subset_size}) must be at most ensemble_size ({self.ensemble_size})")
        return self


def offline_replay(data: Logged, gamma: float, seed: int) -> Replay:
    """The logged steps as a full ``Replay`` of 1-step transitions (terminated: no bootstrap; truncated: bootstrap)."""
    actions = np.asarray(data.action, dtype=np.float32)
    actions = actions.reshape(len(actions), -1)
    replay = Replay(len(actions), data.obs.shape[1], seed, action_dim=actions.shape[1])
    replay.obs[:], replay.next_obs[:], replay.actions[:] = data.obs, data.next_obs, actions
    replay.rewards[:], replay.terminated[:] = data.reward, data.terminated.astype(np.float32)
    replay.discounts[:], replay.size = gamma, len(actions)
    return replay


def symmetric_batch(offline: Replay, online: Replay, batch: int, ratio: float) -> dict[str, np.ndarray]:
    """round(ratio * batch) transitions from ``offline`` then the rest from ``online``, each drawn uniformly with
    its own generator (the paper's symmetric sampling at ratio 0.5)."""
    n_off = int(round(ratio * batch))
    parts = [r.sample(n) for r, n in ((offline, n_off), (online, batch - n_off)) if n > 0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class RLPDNet(nn.Module):
    """What a checkpoint saves: the actor and the critic ensemble."""

    def __init__(self, actor: SquashedGaussian, critics: EnsembleCritic) -> None:
        super().__init__()
        self.actor, self.critics = actor, critics


def _bounded_box(envs: Any) -> Any:
    if action_spec(envs.single_action_space).discrete:
        raise ConfigError(f"classic.agent: rlpd needs a Box action space; {envs.single_action_space} is not")
    space = getattr(envs, "bounded_action_space", envs.single_action_space)
    if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
        raise ConfigError(f"classic.agent: rlpd squashes actions into the Box's bounds; {space} has none")
    return space


def _load_offline(cfg: RLPDSettings, obs_dim: int, act_dim: int, seed: int) -> Replay:
    if not cfg.offline_data or not Path(cfg.offline_data).is_file():
        raise ConfigError(f"classic.agent.offline_data: no logged dataset at {cfg.offline_data!r} "
                          "(a Parquet file of classic/offline.py's columns)")
    replay = offline_replay(load_parquet(cfg.offline_data), cfg.gamma, seed + 1)
    if replay.obs.shape[1] != obs_dim or replay.actions.shape[1] != act_dim:
        raise ConfigError(f"classic.agent.offline_data: observations x actions {replay.obs.shape[1]} x "
                          f"{replay.actions.shape[1]}, the environment's {obs_dim} x {act_dim}")
    return replay


@CLASSIC_AGENTS.register(
    "rlpd", formula="batch: half offline, half online; min sum_e E[(Q_e(s,a) - (r + (1-d) g (min_{e in Z} Q'_e(s',a') "
                    "- alpha log pi(a'|s'))))^2], Z a random M of E; max E[mean_e Q_e(s, a~) - alpha log pi(a~|s)]",
    paper="2302.02948", settings=RLPDSettings)
class RLPD(SoftActorCore):
    """The agent: actor, critic ensemble and its target, alpha, the offline data and the online replay."""

    def __init__(self, envs: Any, seed: int, cfg: RLPDSettings) -> None:
        self.cfg, self.envs = cfg, envs
        space, obs_dim = _bounded_box(envs), flat_obs_dim(envs.single_observation_space)
        act_dim = int(np.asarray(space.low).size)
        self.offline = _load_offline(cfg, obs_dim, act_dim, seed)
        torch.manual_seed(seed)
        self.actor = SquashedGaussian(obs_dim, cfg.hidden, np.asarray(space.low), np.asarray(space.high))
        self.critics, self.targets = (EnsembleCritic(obs_dim, act_dim, cfg.hidden, cfg.ensemble_size, cfg.layer_norm)
                                      for _ in range(2))
        self.targets.load_state_dict(self.critics.state_dict())
        self.net = RLPDNet(self.actor, self.critics)
        self.q_optimizer = torch.optim.Adam(self.critics.parameters(), lr=cfg.q_lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.policy_lr)
        self._init_alpha(cfg.alpha, cfg.policy_lr, -act_dim / 2.0)
        self.optimizer = self.q_optimizer  # what a checkpoint records (run.py)
        self.generator = torch.Generator().manual_seed(seed)
        self.replay = Replay(cfg.buffer_size, obs_dim, seed, action_dim=act_dim)
        self.nstep = [NStep(1, cfg.gamma, self.replay) for _ in range(envs.num_envs)]
        self.steps_per_iteration = envs.num_envs
        self.env_steps, self.critic_steps = 0, 0
        self._reset(seed)

    def iterate(self, progress: float) -> Iteration:
        """One vector step, then (after ``learning_starts``) ``utd`` critic steps and one actor step."""
        t0 = time.perf_counter()
        episodes = self._env_step()
        rollout_s = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        if self.env_steps > self.cfg.learning_starts and self.replay.size >= 1:
            for _ in range(self.cfg.utd):
                t = self.sample()
                metrics = self.critic_step(t)
            metrics.update(self.actor_step(t["obs"]))
        return Iteration(episodes, metrics, rollout_s)

    def sample(self) -> dict[str, Tensor]:
        batch = symmetric_batch(self.offline, self.replay, self.cfg.batch_size, self.cfg.offline_ratio)
        return {k: torch.from_numpy(v) for k, v in batch.items()}

    def target(self, t: dict[str, Tensor]) -> Tensor:
        """y with a fresh random subset of ``subset_size`` target critics (drawn from the agent's generator)."""
        with torch.no_grad():
            next_action, next_logp = self.actor(t["next_obs"], self.generator)
            subset = torch.randperm(self.cfg.ensemble_size, generator=self.generator)[: self.cfg.subset_size]
            next_q = subset_min(self.targets(t["next_obs"], next_action), subset)
            alpha = self.alpha if self.cfg.backup_entropy else 0.0
            return soft_q_targets(t["rewards"], t["discounts"], t["terminated"], next_q, next_logp, alpha)

    def critic_step(self, t: dict[str, Tensor]) -> dict[str, float]:
        y = self.target(t)
        q = self.critics(t["obs"], t["actions"])  # [E, B]
        q_loss = ((q - y) ** 2).mean(1).sum()
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_optimizer.step()
        polyak_update(self.targets, self.critics, self.cfg.tau)
        self.critic_steps += 1
        return {"train/q_loss": q_loss.item() / self.cfg.ensemble_size, "train/q_mean": q.mean().item(),
                "train/alpha": self.alpha}

    def actor_step(self, obs: Tensor) -> dict[str, float]:
        action, logp = self.actor(obs, self.generator)
        actor_loss = (self.alpha * logp - self.critics(obs, action).mean(0)).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        return {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item(), **self._alpha_step(logp)}
