"""PPO (Schulman et al. 2017, arXiv:1707.06347) on Gymnasium environments, discrete and continuous, read top
to bottom: collect a rollout, estimate advantages, update.

It follows CleanRL's ``ppo.py`` and ``ppo_continuous_action.py`` (Huang et al. 2022; the defaults of
``classic.ppo`` are ppo.py's) and is built from ``algo/``'s parts: GAE (``gae_advantages_and_returns``,
over episode rows from ``episode_rows``), the clipped surrogate (``ppo_clip_loss``), the clipped value
loss (``clipped_value_loss``), the entropy (``entropy_from_logits`` for categorical policies).

Termination vs truncation: a terminated episode's next value is 0; a truncated one (a time limit) is
bootstrapped from its last observation, r_t <- r_t + gamma V(s_final), and the end of a rollout from
the next observation, r_{T-1} <- r_{T-1} + gamma V(s_T), after which every step that ends an episode
or the rollout ends its row, so GAE's recursion A_t = delta_t + gamma lam A_{t+1} stops there. This
gives CleanRL's advantages exactly except on truncation, where CleanRL's ppo.py treats the time limit
as a termination (no bootstrap; SB3 bootstraps as we do). ``approx_kl`` is ppo_clip_loss's k3
estimate (exp(-x) - 1 + x, x = log pi/pi_old; CleanRL logs (r - 1) - log r), and ``target_kl`` stops
the update after an epoch whose mean of it exceeds the target (CleanRL tests the epoch's last mini-batch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import ClipSettings, ppo_clip_loss
from reinforge.algo.returns import episode_rows, gae_advantages_and_returns
from reinforge.algo.value import clipped_value_loss, explained_variance
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.envs import final_observations, finished_episodes, obs_tensor
from reinforge.classic.networks import ActorCritic, action_spec
from reinforge.errors import ConfigError
from reinforge.registry import Settings


class PPOSettings(Settings):
    """PPO's hyper-parameters (CleanRL ppo.py's defaults)."""

    num_steps: int = Field(128, ge=1, description="steps per environment per rollout")
    lr: float = Field(2.5e-4, gt=0, description="Adam learning rate (eps 1e-5)")
    anneal_lr: bool = Field(True, description="decay the learning rate linearly to 0 over the run")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    num_minibatches: int = Field(4, ge=1, description="mini-batches per epoch")
    update_epochs: int = Field(4, ge=1, description="passes over each rollout")
    norm_adv: bool = Field(True, description="whiten the advantages per mini-batch")
    clip_coef: float = Field(0.2, ge=0, description="PPO clip range epsilon")
    clip_vloss: bool = Field(True, description="clip the value loss around the old values (range clip_coef)")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    vf_coef: float = Field(0.5, ge=0, description="value loss coefficient")
    max_grad_norm: float = Field(0.5, gt=0, description="global gradient-norm clip")
    target_kl: float | None = Field(None, gt=0, description="stop the epochs of an update once approx_kl exceeds it")
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1, description="MLP widths (tanh)")


@dataclass
class Rollout:
    """``num_steps`` x ``num_envs`` steps, time-major: obs [T, E, D], actions [T, E(, A)], log-probs,
    values, rewards (bootstraps folded in) and ``ends`` (the step ends an episode or the rollout) [T, E]."""

    obs: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    ends: Tensor
    episodes: list[tuple[float, int]]


def gae_with_ends(rewards: Tensor, values: Tensor, ends: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE advantages and returns of time-major [T, E] steps whose episodes stop where ``ends`` is True
    (bootstrap values already folded into the rewards): each segment becomes a row of
    ``gae_advantages_and_returns``."""
    row, col, n, width = episode_rows(ends.T)
    lay = torch.zeros(n, width, dtype=torch.float64)
    r_rows, v_rows, m_rows = lay.clone(), lay.clone(), lay.clone()
    r_rows[row, col], v_rows[row, col], m_rows[row, col] = rewards.T.double(), values.T.double(), 1.0
    adv, ret = gae_advantages_and_returns(r_rows, v_rows, m_rows, gamma, lam)
    return adv[row, col].T.to(values.dtype), ret[row, col].T.to(values.dtype)


@CLASSIC_AGENTS.register(
    "ppo", formula="max_theta E[min(r A, clip(r, 1-eps, 1+eps) A)] - c_v L_V + c_H H, r = pi/pi_old, A = GAE",
    paper="1707.06347", settings=PPOSettings)
class PPO:
    """The agent: its network, optimizer and the environments' current observations."""

    def __init__(self, envs: Any, seed: int, cfg: PPOSettings) -> None:
        self.cfg, self.envs = cfg, envs
        self.steps_per_iteration = cfg.num_steps * envs.num_envs
        if self.steps_per_iteration < cfg.num_minibatches:
            raise ConfigError(f"classic.agent.num_minibatches ({cfg.num_minibatches}) exceeds the rollout's "
                              f"env.num_envs * num_steps = {self.steps_per_iteration} steps")
        try:
            spec = action_spec(envs.single_action_space)
        except ValueError as e:
            raise ConfigError(f"classic.env.id: {e}") from None
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        torch.manual_seed(seed)
        self.net = ActorCritic(obs_dim, spec, cfg.hidden)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed)
        obs, _ = envs.reset(seed=seed)
        self.obs = obs_tensor(obs)

    def iterate(self, progress: float) -> Iteration:
        """A rollout, then its update (the learning rate decayed linearly to 0 if ``anneal_lr``)."""
        t0 = time.perf_counter()
        ro = self.collect()
        rollout_s = time.perf_counter() - t0
        metrics = self.update(ro, 1.0 - progress if self.cfg.anneal_lr else 1.0)
        return Iteration(ro.episodes, metrics, rollout_s)

    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        return self.net.act(obs, self.generator, deterministic=deterministic)[0]

    def _env_step(self, action: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Any]]:
        act = action.numpy() if not self.net.action.discrete else action.numpy().astype(np.int64)
        obs, reward, terminated, truncated, info = self.envs.step(act)
        reward = torch.as_tensor(np.asarray(reward), dtype=torch.float32)
        return obs_tensor(obs), reward, torch.as_tensor(terminated), torch.as_tensor(truncated), info

    def _bootstrap(self, reward: Tensor, terminated: Tensor, truncated: Tensor, info: dict[str, Any]) -> Tensor:
        """r + gamma V(s_final) for the environments truncated in this step (not the terminated ones)."""
        index, final = final_observations(info)
        keep = [k for k, i in enumerate(index) if truncated[i] and not terminated[i]]
        if keep:
            with torch.no_grad():
                v = self.net.value(obs_tensor(final[keep]))
            reward = reward.clone()
            reward[torch.as_tensor(index[keep])] += self.cfg.gamma * v
        return reward

    def collect(self) -> Rollout:
        """``num_steps`` steps of every environment with the current policy."""
        t_steps, e = self.cfg.num_steps, self.envs.num_envs
        obs, actions, logps, values, rewards, ends = [], [], [], [], [], []
        episodes: list[tuple[float, int]] = []
        for _ in range(t_steps):
            action, logp, value = self.net.act(self.obs, self.generator)
            next_obs, reward, terminated, truncated, info = self._env_step(action)
            obs.append(self.obs)
            actions.append(action)
            logps.append(logp)
            values.append(value)
            rewards.append(self._bootstrap(reward, terminated, truncated, info))
            ends.append(terminated | truncated)
            episodes += finished_episodes(info)
            self.obs = next_obs
        rewards[-1] = rewards[-1].clone()
        open_ = ~ends[-1]
        with torch.no_grad():
            rewards[-1][open_] += self.cfg.gamma * self.net.value(self.obs)[open_]
        ends[-1] = torch.ones(e, dtype=torch.bool)
        return Rollout(torch.stack(obs), torch.stack(actions), torch.stack(logps), torch.stack(values),
                       torch.stack(rewards), torch.stack(ends), episodes)

    def update(self, ro: Rollout, lr_frac: float = 1.0) -> dict[str, float]:
        """Advantages, then ``update_epochs`` passes of ``num_minibatches`` clipped-PPO steps."""
        cfg = self.cfg
        adv, ret = gae_with_ends(ro.rewards, ro.values, ro.ends, cfg.gamma, cfg.gae_lambda)
        n = ro.rewards.numel()
        batch = {"obs": ro.obs.reshape(n, -1), "actions": ro.actions.reshape(n, *ro.actions.shape[2:]),
                 "logp": ro.logp.reshape(n), "values": ro.values.reshape(n), "adv": adv.reshape(n),
                 "returns": ret.reshape(n)}
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * lr_frac
        sums: dict[str, float] = {}
        steps = 0
        for _ in range(cfg.update_epochs):
            order, epoch_kl = torch.randperm(n, generator=self.generator), []
            for mb in order.chunk(cfg.num_minibatches):
                step = self.minibatch_step({k: t[mb] for k, t in batch.items()})
                for k, v in step.items():
                    sums[k] = sums.get(k, 0.0) + v
                epoch_kl.append(step["train/approx_kl"])
                steps += 1
            if cfg.target_kl is not None and float(np.mean(epoch_kl)) > cfg.target_kl:
                break
        metrics = {k: v / steps for k, v in sums.items()}
        metrics["train/explained_variance"] = explained_variance(batch["values"], batch["returns"], torch.ones(n))
        metrics["train/lr"] = cfg.lr * lr_frac
        return metrics

    def minibatch_step(self, mb: dict[str, Tensor]) -> dict[str, float]:
        """One optimizer step: L = L_clip - ent_coef H + vf_coef L_V (CleanRL's loss)."""
        cfg = self.cfg
        logp, entropy, value = self.net.evaluate(mb["obs"], mb["actions"])
        adv = mb["adv"]
        if cfg.norm_adv and adv.numel() > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg, pm = ppo_clip_loss(logp, mb["logp"], adv, ClipSettings(clip_low=cfg.clip_coef, clip_high=cfg.clip_coef))
        vclip = cfg.clip_coef if cfg.clip_vloss else 0.0
        vl, _ = clipped_value_loss(value, mb["values"], mb["returns"], vclip)
        pg_loss, v_loss, ent = pg.mean(), vl.mean(), entropy.mean()
        loss = pg_loss - cfg.ent_coef * ent + cfg.vf_coef * v_loss
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        return {"train/policy_loss": pg_loss.item(), "train/value_loss": v_loss.item(), "train/entropy": ent.item(),
                "train/approx_kl": pm["approx_kl_old"].mean().item(), "train/clip_frac": pm["clip_frac"].mean().item(),
                "train/grad_norm": float(grad_norm)}
