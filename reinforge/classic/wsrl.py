"""WSRL, warm-start RL (Zhou, Peng, Li, Levine & Kumar 2024, "Efficient Online Reinforcement Learning Fine-Tuning
Need Not Retain Offline Data", arXiv:2412.07762): offline pretraining, then online SAC that keeps none of the
offline data, seeded by a short warmup of the pretrained policy's own rollouts.

    1. pretrain:  ``pretrain_steps`` Cal-QL (or CQL) steps on the logged data (classic/cql_box.py's learner)
    2. warmup:    ``warmup_steps`` environment steps of the pretrained policy's sampled actions into an empty
                  online replay, no update (the data that "recalibrates" Q to the online distribution)
    3. online:    the offline data is dropped; per environment step ``utd`` SAC critic steps
                  min E[(Q_j(s, a) - (r + (1 - d) g (min_j Q'_j(s', a') - alpha log pi(a'|s'))))^2]
                  on online batches and one actor and alpha step; actor, critics and alpha start from step 1

Defaults: the paper's as we read them (Cal-QL pretraining with weight 5 and 10 action samples, a warmup of
5000 steps, UTD 4; not re-checked against the full text here), batch 256, gamma 0.99, tau 0.005; the learning rates of the
pretraining carry on online (Adam 1e-4 actor and alpha, 3e-4 critics). Choices: twin critics (the paper's
online phase uses a critic ensemble with LayerNorm, as we read it), pretraining in the agent's constructor (it takes no
environment step) from the logged data at ``offline_data``. docs/classic.md, "WSRL".
"""

from __future__ import annotations

import time
from typing import Any

import torch
from pydantic import Field

from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.cql_box import ConservativeSAC, CQLSettings
from reinforge.classic.envs import finished_episodes, flat_obs_dim, next_observations, obs_tensor
from reinforge.classic.offline_box import bounded_box, load_logged
from reinforge.classic.replay import NStep, Replay, store_vector_step
from reinforge.classic.sac import SACNet


class WSRLSettings(CQLSettings):
    """WSRL's options: the pretraining's (CQLSettings, Cal-QL by default) and the online phase's."""

    calibrated: bool = Field(True, description="pretrain with Cal-QL (False: CQL)")
    pretrain_steps: int = Field(20_000, ge=0, description="offline gradient steps before any environment step")
    warmup_steps: int = Field(5000, ge=0, description="environment steps of the pretrained policy before updates")
    utd: int = Field(4, ge=1, description="critic steps per vector environment step online (update-to-data ratio)")
    buffer_size: int = Field(1_000_000, ge=1, description="online replay capacity (transitions)")


@CLASSIC_AGENTS.register(
    "wsrl", formula="pretrain Cal-QL offline; warmup: K steps of pi_pretrained, no update; online SAC "
                    "min E[(Q_j(s,a) - (r + (1-d) g (min_j Q'_j(s',a') - alpha log pi(a'|s'))))^2] on online data only",
    paper="2412.07762", settings=WSRLSettings)
class WSRL:
    """The agent: the pretrained learner (actor, twin critics, targets, alpha) and the online replay."""

    def __init__(self, envs: Any, seed: int, cfg: WSRLSettings) -> None:
        self.cfg, self.envs = cfg, envs
        low, high = bounded_box(envs, "wsrl")
        obs_dim = flat_obs_dim(envs.single_observation_space)
        self.learner = ConservativeSAC(obs_dim, low, high, cfg, seed)
        self.pretrain_metrics = self._pretrain(load_logged(cfg.offline_data, envs, cfg.gamma, seed), cfg.pretrain_steps)
        self.learner.cfg = cfg.model_copy(update={"cql_weight": 0.0, "backup_entropy": True})  # online: SAC
        self.net = SACNet(self.learner.actor, self.learner.critics)
        self.optimizer, self.generator = self.learner.critic_optimizer, self.learner.generator
        self.replay = Replay(cfg.buffer_size, obs_dim, seed, action_dim=int(low.size))
        self.nstep = [NStep(1, cfg.gamma, self.replay) for _ in range(envs.num_envs)]
        self.steps_per_iteration = envs.num_envs
        self.env_steps = 0
        obs, _ = envs.reset(seed=seed)
        self.obs = obs_tensor(obs)

    def _pretrain(self, data: Any, steps: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for _ in range(steps):
            metrics = self.learner.gradient_step(data.sample(self.cfg.batch_size))
        return metrics  # the data goes out of scope here: nothing offline is retained

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool) -> torch.Tensor:
        """The policy's action (tanh of the mean if ``deterministic``)."""
        return self.learner.actor(obs, self.generator, deterministic)[0]

    def iterate(self, progress: float) -> Iteration:
        """One vector step of the policy (sampled); past the warmup, ``utd`` critic steps and one actor step."""
        t0 = time.perf_counter()
        action = self.act(self.obs, False).numpy()
        obs, reward, terminated, truncated, info = self.envs.step(action)
        store_vector_step(self.nstep, self.obs.numpy(), action, reward, next_observations(obs, info), terminated,
                          truncated)
        self.obs, self.env_steps = obs_tensor(obs), self.env_steps + self.envs.num_envs
        rollout_s = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        if self.env_steps > self.cfg.warmup_steps and self.replay.size >= 1:
            for _ in range(self.cfg.utd):
                t = {k: torch.from_numpy(v) for k, v in self.replay.sample(self.cfg.batch_size).items()}
                metrics = self.learner.critic_step(t)
            metrics.update(self.learner.actor_step(t["obs"]))
        return Iteration(finished_episodes(info), metrics, rollout_s)

