"""TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning", arXiv:2106.06860):
TD3 on a logged dataset with a behaviour-cloning term in the actor's loss and normalised observations.

    critic:  min E[(Q_j(s, a) - y)^2],  y = r + (1 - d) g min_j Q'_j(s', clip(pi'(s') + clip(eps, -c, c), low, high))
    actor:   min -lambda E[Q_1(s, pi(s))] + E[((pi(s) - a) / h)^2],  lambda = alpha / E|Q_1(s, pi(s))|
             (every ``policy_frequency`` critic steps; then the targets pi', Q' are Polyak-averaged)

Defaults are the paper's (section 5 and appendix C, the authors' TD3_BC code): alpha 2.5, Adam 3e-4 for both,
batch 256, tau 0.005, gamma 0.99, policy noise 0.2 and noise clip 0.5 (times the Box's half-width h),
actor every 2 critic steps, 256-256 ReLU networks, observations normalised by the dataset's mean and std
(+1e-3). Choice: the behaviour-cloning term is on actions rescaled to [-1, 1] by the Box (D4RL's actions
are already there), the Q networks see actions in the environment's units. tensor math: algo/offline_rl.py.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor, nn

from reinforge.algo.offline_rl import smoothed_target_action, td3_bc_actor_loss
from reinforge.algo.qlearning import soft_q_targets
from reinforge.classic.agents import CLASSIC_AGENTS
from reinforge.classic.dqn import q_network
from reinforge.classic.envs import flat_obs_dim
from reinforge.classic.networks import polyak_update
from reinforge.classic.offline_box import OfflineBoxSettings, OfflineIterations, bounded_box, load_logged
from reinforge.classic.sac import Critics


class TD3BCSettings(OfflineBoxSettings):
    """TD3+BC's options (the paper's defaults)."""

    alpha: float = Field(2.5, ge=0, description="lambda = alpha / mean|Q|: the weight of Q against behaviour cloning "
                         "(0: behaviour cloning alone)")
    policy_noise: float = Field(0.2, ge=0, description="target smoothing noise std (times the Box's half-width)")
    noise_clip: float = Field(0.5, ge=0, description="the smoothing noise's clip (times the Box's half-width)")
    policy_frequency: int = Field(2, ge=1, description="critic steps per actor (and target) update")
    actor_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the actor")
    critic_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the critics")
    normalize_obs: bool = Field(True, description="normalise observations by the dataset's mean and std")


class DeterministicActor(nn.Module):
    """pi(s) = bias + scale * tanh(MLP(s)): actions inside the Box."""

    def __init__(self, obs_dim: int, hidden: list[int], low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()
        self.body = q_network(obs_dim, hidden, int(low.size))
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32).reshape(1, -1))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32).reshape(1, -1))

    def forward(self, obs: Tensor) -> Tensor:
        return self.bias + self.scale * torch.tanh(self.body(obs))


class TD3BCNet(nn.Module):
    """What a checkpoint saves: the actor, the critics and the observation statistics."""

    def __init__(self, actor: DeterministicActor, critics: Critics, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.actor, self.critics = actor, critics
        self.register_buffer("obs_mean", mean)
        self.register_buffer("obs_std", std)

    def normalize(self, obs: Tensor) -> Tensor:
        return (obs - self.obs_mean) / self.obs_std


@CLASSIC_AGENTS.register(
    "td3_bc", formula="min E[(Q_j(s,a) - (r + (1-d) g min_j Q'_j(s', pi'(s') + clip(eps))))^2]; "
                      "min -alpha/mean|Q| E[Q_1(s, pi(s))] + E[(pi(s) - a)^2]", paper="2106.06860",
    settings=TD3BCSettings)
class TD3BC(OfflineIterations):
    """The agent: the logged data (normalised), actor, twin critics and their targets."""

    def __init__(self, envs: Any, seed: int, cfg: TD3BCSettings) -> None:
        self.cfg, self.envs = cfg, envs
        low, high = bounded_box(envs, "td3_bc")
        self.data = load_logged(cfg.offline_data, envs, cfg.gamma, seed)
        obs_dim = flat_obs_dim(envs.single_observation_space)
        mean, std = torch.zeros(1, obs_dim), torch.ones(1, obs_dim)
        if cfg.normalize_obs:
            mean, std = self.data.obs.mean(0, keepdim=True), self.data.obs.std(0, keepdim=True) + 1e-3
        torch.manual_seed(seed)
        self.actor = DeterministicActor(obs_dim, cfg.hidden, low, high)
        self.critics = Critics(obs_dim, int(low.size), cfg.hidden)
        self.net = TD3BCNet(self.actor, self.critics, mean, std)
        self.data.obs, self.data.next_obs = self.net.normalize(self.data.obs), self.net.normalize(self.data.next_obs)
        self.actor_target, self.critic_targets = copy.deepcopy(self.actor), copy.deepcopy(self.critics)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.optimizer = torch.optim.Adam(self.critics.parameters(), lr=cfg.critic_lr)  # what a checkpoint records
        self.low, self.high = torch.as_tensor(low).reshape(1, -1), torch.as_tensor(high).reshape(1, -1)
        self.generator = torch.Generator().manual_seed(seed)
        self.steps_per_iteration = cfg.iteration_steps
        self.critic_steps = 0

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        """pi(s) (deterministic either way: TD3+BC evaluates its actor without exploration noise)."""
        return self.actor(self.net.normalize(obs))

    def target(self, t: dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            next_action = self.actor_target(t["next_obs"])
            noise = torch.randn(next_action.shape, generator=self.generator) * self.cfg.policy_noise * self.actor.scale
            smoothed = smoothed_target_action(next_action, noise, self.cfg.noise_clip * self.actor.scale,
                                              self.low, self.high)
            q1, q2 = self.critic_targets(t["next_obs"], smoothed)
            discounts = torch.full_like(t["rewards"], self.cfg.gamma)
            return soft_q_targets(t["rewards"], discounts, t["terminated"], torch.minimum(q1, q2),
                                  torch.zeros_like(q1), 0.0)

    def gradient_step(self, t: dict[str, Tensor]) -> dict[str, float]:
        """A critic step; every ``policy_frequency`` of them an actor step and the target updates."""
        y = self.target(t)
        q1, q2 = self.critics(t["obs"], t["actions"])
        q_loss = nn.functional.mse_loss(q1, y) + nn.functional.mse_loss(q2, y)
        self.optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.optimizer.step()
        self.critic_steps += 1
        metrics = {"train/q_loss": q_loss.item() / 2, "train/q_mean": q1.mean().item()}
        if self.critic_steps % self.cfg.policy_frequency == 0:
            pi = self.actor(t["obs"])
            actor_loss, lam = td3_bc_actor_loss(self.critics(t["obs"], pi)[0], pi, t["actions"], self.cfg.alpha,
                                                self.actor.scale)
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optimizer.step()
            polyak_update(self.critic_targets, self.critics, self.cfg.tau)
            polyak_update(self.actor_target, self.actor, self.cfg.tau)
            self.last_actor = {"train/actor_loss": actor_loss.item(), "train/lambda": float(lam)}
        return {**metrics, **getattr(self, "last_actor", {})}
