"""SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications", arXiv:1812.05905) on
Gymnasium environments with Box actions, read top to bottom: a tanh-squashed Gaussian policy, twin Q
networks with Polyak-averaged targets (clipped double Q), the entropy temperature alpha tuned to a
target entropy of -dim(A), and a uniform replay (``replay.py``, n-step as for DQN).

    critic:  min_phi  E[(Q_phi_j(s, a) - y)^2],  y = R + (1 - d) g (min_j Q'_j(s', a') - alpha log pi(a'|s'))
    actor:   min_theta E[alpha log pi(a~|s) - min_j Q_j(s, a~)],  a~ = scale * tanh(mu + sigma eps) + bias
    alpha:   min_alpha E[-alpha (log pi(a~|s) - dim(A))]   (``autotune``)

Defaults are CleanRL's ``sac_continuous_action.py`` (Huang et al. 2022): Adam 3e-4 (actor) and 1e-3
(critics), batch 256, buffer 1e6, tau 0.005, gamma 0.99, learning from step 5000 (uniform random
actions before), the actor and alpha updated every 2 critic steps (as often: TD3's delayed update with
CleanRL's compensation), log-std squashed into [-5, 2], 256-256 ReLU MLPs. One iteration is
``train_frequency`` vector steps then ``gradient_steps`` critic steps. Truncation bootstraps (as DQN).
"""

from __future__ import annotations

import math
import time
from typing import Any, Self

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from reinforge.algo.qlearning import soft_q_targets
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.dqn import q_network
from reinforge.classic.envs import finished_episodes, flat_obs_dim, next_observations, obs_tensor
from reinforge.classic.her import HERSettings, HindsightReplay
from reinforge.classic.networks import action_spec, polyak_update
from reinforge.classic.replay import NStep, Replay, store_vector_step
from reinforge.errors import ConfigError
from reinforge.registry import Settings

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class SACSettings(Settings):
    """SAC's hyper-parameters (CleanRL sac_continuous_action.py's defaults)."""

    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    tau: float = Field(0.005, gt=0, le=1, description="target networks: phi' <- tau phi + (1 - tau) phi'")
    buffer_size: int = Field(1_000_000, ge=1, description="replay capacity (transitions)")
    batch_size: int = Field(256, ge=1, description="transitions per gradient step")
    learning_starts: int = Field(5000, ge=0, description="environment steps of uniform random actions before learning")
    policy_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the actor (and of alpha)")
    q_lr: float = Field(1e-3, gt=0, description="Adam learning rate of the critics")
    policy_frequency: int = Field(2, ge=1, description="critic steps per actor update (the actor then takes as many)")
    target_network_frequency: int = Field(1, ge=1, description="critic steps per target update")
    train_frequency: int = Field(1, ge=1, description="vector steps per iteration")
    gradient_steps: int = Field(1, ge=1, description="critic steps per iteration")
    alpha: float = Field(0.2, gt=0, description="entropy temperature (the initial one with autotune)")
    autotune: bool = Field(True, description="tune alpha to the target entropy -dim(A)")
    n_step: int = Field(1, ge=1, description="rewards summed before bootstrapping")
    hidden: list[int] = Field(default_factory=lambda: [256, 256], min_length=1, description="MLP widths (ReLU)")
    her: HERSettings | None = Field(None, description="hindsight experience replay on a goal environment "
                                    "({strategy: future, k: 4}; classic/her.py); None = off")

    @model_validator(mode="after")
    def _her_one_step(self) -> Self:
        if self.her is not None and self.n_step != 1:
            raise ValueError("her relabels 1-step transitions: n_step must be 1")
        return self


class SquashedGaussian(nn.Module):
    """pi(a|s): a = scale * tanh(u) + bias, u ~ N(mu(s), sigma(s)); log-prob with the tanh correction."""

    def __init__(self, obs_dim: int, hidden: list[int], low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()
        self.body = q_network(obs_dim, hidden[:-1], hidden[-1]) if len(hidden) > 1 else nn.Linear(obs_dim, hidden[0])
        dim = int(low.size)
        self.mean, self.log_std = nn.Linear(hidden[-1], dim), nn.Linear(hidden[-1], dim)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32).reshape(1, dim))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32).reshape(1, dim))

    def forward(self, obs: Tensor, generator: torch.Generator | None = None,
                deterministic: bool = False) -> tuple[Tensor, Tensor]:
        """An action and its log-prob [B]."""
        h = torch.relu(self.body(obs))
        mu, log_std = self.mean(h), torch.tanh(self.log_std(h))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        std = log_std.exp()
        u = mu if deterministic else mu + std * torch.randn(mu.shape, generator=generator, dtype=mu.dtype)
        squashed = torch.tanh(u)
        logp = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        logp = logp - torch.log(self.scale * (1 - squashed.pow(2)) + 1e-6).sum(-1)
        return squashed * self.scale + self.bias, logp


class Critics(nn.Module):
    """Twin Q(s, a) networks."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.q1, self.q2 = (q_network(obs_dim + act_dim, hidden, 1) for _ in range(2))

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([obs, action], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class SACNet(nn.Module):
    """What a checkpoint saves: the actor and the critics."""

    def __init__(self, actor: SquashedGaussian, critics: Critics) -> None:
        super().__init__()
        self.actor, self.critics = actor, critics


class SoftActorCore:
    """What SAC and the agents built on it (rlpd.py, mbpo.py) share: the temperature, acting, one vector
    environment step into the replay (``_store``, overridden for HER) and the alpha step. The agent sets
    ``cfg`` (with ``learning_starts``, ``autotune``, ``alpha``), ``envs``, ``actor``, ``generator``, ``nstep``,
    ``env_steps``, ``obs``/``raw_obs`` and calls ``_init_alpha``."""

    cfg: Any
    envs: Any
    actor: SquashedGaussian
    generator: torch.Generator
    nstep: list[NStep]
    env_steps: int

    def _init_alpha(self, initial: float, lr: float, target_entropy: float) -> None:
        self.target_entropy = target_entropy
        self.log_alpha = torch.tensor(math.log(initial), requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)

    def _reset(self, seed: int) -> None:
        obs, _ = self.envs.reset(seed=seed)
        self.raw_obs, self.obs = obs, obs_tensor(obs)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp()) if self.cfg.autotune else self.cfg.alpha

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's action (tanh of the mean if ``deterministic``)."""
        return self.actor(obs, self.generator, deterministic)[0]

    def _env_step(self) -> list[tuple[float, int]]:
        """One vector step (uniform random actions before ``learning_starts``) stored in the replay."""
        if self.env_steps < self.cfg.learning_starts:
            action = np.asarray(self.envs.action_space.sample(), dtype=np.float32)
        else:
            action = self.act(self.obs, False).numpy()
        obs, reward, terminated, truncated, info = self.envs.step(action)
        self._store(action, reward, obs, info, terminated, truncated)
        self.raw_obs, self.obs = obs, obs_tensor(obs)
        self.env_steps += self.envs.num_envs
        return finished_episodes(info)

    def _store(self, action: np.ndarray, reward: np.ndarray, obs: Any, info: dict[str, Any], terminated: np.ndarray,
               truncated: np.ndarray) -> None:
        store_vector_step(self.nstep, self.obs.numpy(), action, reward, next_observations(obs, info),
                          terminated, truncated)

    def _alpha_step(self, logp: Tensor) -> dict[str, float]:
        """min_alpha E[-alpha (log pi + target entropy)] (with ``autotune``; else nothing)."""
        if not self.cfg.autotune:
            return {}
        alpha_loss = (-self.log_alpha.exp() * (logp.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optimizer.step()
        return {"train/alpha_loss": alpha_loss.item()}


@CLASSIC_AGENTS.register(
    "sac", formula="min E[(Q_j(s,a) - (R + (1-d) g (min_j Q'_j(s',a') - alpha log pi(a'|s'))))^2]; "
                   "max E[min_j Q_j(s, a~) - alpha log pi(a~|s)]", paper="1812.05905", settings=SACSettings)
class SAC(SoftActorCore):
    """The agent: actor, twin critics and their targets, alpha, the replay and the observations."""

    def __init__(self, envs: Any, seed: int, cfg: SACSettings) -> None:
        self.cfg, self.envs = cfg, envs
        spec = action_spec(envs.single_action_space)
        if spec.discrete:
            raise ConfigError(f"classic.agent: sac needs a Box action space; {envs.single_action_space} is not "
                              "(use dqn or ppo)")
        space = getattr(envs, "bounded_action_space", envs.single_action_space)
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ConfigError(f"classic.agent: sac squashes actions into the Box's bounds; {space} has none")
        obs_dim = flat_obs_dim(envs.single_observation_space)
        torch.manual_seed(seed)
        self.actor = SquashedGaussian(obs_dim, cfg.hidden, np.asarray(space.low), np.asarray(space.high))
        self.critics, self.targets = Critics(obs_dim, spec.dim, cfg.hidden), Critics(obs_dim, spec.dim, cfg.hidden)
        self.targets.load_state_dict(self.critics.state_dict())
        self.net = SACNet(self.actor, self.critics)
        self.q_optimizer = torch.optim.Adam(self.critics.parameters(), lr=cfg.q_lr)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.policy_lr)
        self._init_alpha(cfg.alpha, cfg.policy_lr, -float(spec.dim))
        self.optimizer = self.q_optimizer  # what a checkpoint records (run.py)
        self.generator = torch.Generator().manual_seed(seed)
        self.replay = Replay(cfg.buffer_size, obs_dim, seed, action_dim=spec.dim)
        self.nstep = [NStep(cfg.n_step, cfg.gamma, self.replay) for _ in range(envs.num_envs)]
        self.her = HindsightReplay(cfg.her, self.replay, envs, cfg.gamma, seed) if cfg.her is not None else None
        self.steps_per_iteration = cfg.train_frequency * envs.num_envs
        self.env_steps, self.critic_steps = 0, 0
        self._reset(seed)

    def _store(self, action: np.ndarray, reward: np.ndarray, obs: Any, info: dict[str, Any], terminated: np.ndarray,
               truncated: np.ndarray) -> None:
        if self.her is not None:
            self.her.store_vector_step(self.raw_obs, action, reward, obs, info, terminated, truncated)
        else:
            super()._store(action, reward, obs, info, terminated, truncated)

    def iterate(self, progress: float) -> Iteration:
        """``train_frequency`` vector steps, then (after ``learning_starts``) ``gradient_steps`` updates."""
        t0 = time.perf_counter()
        episodes: list[tuple[float, int]] = []
        for _ in range(self.cfg.train_frequency):
            episodes += self._env_step()
        rollout_s = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        if self.env_steps > self.cfg.learning_starts and self.replay.size >= self.cfg.batch_size:
            for _ in range(self.cfg.gradient_steps):
                for k, v in self.gradient_step(self.replay.sample(self.cfg.batch_size)).items():
                    metrics[k] = v  # the last step's values
        return Iteration(episodes, metrics, rollout_s)

    def gradient_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """A critic step; every ``policy_frequency`` of them as many actor (and alpha) steps; targets."""
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        with torch.no_grad():
            next_action, next_logp = self.actor(t["next_obs"], self.generator)
            q1_next, q2_next = self.targets(t["next_obs"], next_action)
            y = soft_q_targets(t["rewards"], t["discounts"], t["terminated"], torch.minimum(q1_next, q2_next),
                               next_logp, self.alpha)
        q1, q2 = self.critics(t["obs"], t["actions"])
        q_loss = nn.functional.mse_loss(q1, y) + nn.functional.mse_loss(q2, y)
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_optimizer.step()
        self.critic_steps += 1
        metrics = {"train/q_loss": q_loss.item() / 2, "train/q_mean": q1.mean().item(), "train/alpha": self.alpha}
        if self.critic_steps % self.cfg.policy_frequency == 0:
            for _ in range(self.cfg.policy_frequency):
                metrics.update(self._actor_step(t["obs"]))
        if self.critic_steps % self.cfg.target_network_frequency == 0:
            polyak_update(self.targets, self.critics, self.cfg.tau)
        return metrics

    def _actor_step(self, obs: Tensor) -> dict[str, float]:
        action, logp = self.actor(obs, self.generator)
        q1, q2 = self.critics(obs, action)
        actor_loss = (self.alpha * logp - torch.minimum(q1, q2)).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        return {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item(), **self._alpha_step(logp)}
