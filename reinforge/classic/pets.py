"""PETS (Chua, Calandra, McAllister & Levine 2018, "Deep Reinforcement Learning in a Handful of Trials using
Probabilistic Dynamics Models", arXiv:1805.12114): model-predictive control with the probabilistic ensemble of
classic/dynamics.py (MBPO's) and the cross-entropy method over action sequences, returns estimated by
trajectory sampling. Read top to bottom: the settings, ``particle_returns`` (TS-inf / TS-1), ``cem_plan``, the
agent.

    each env step:  for i < iterations:  A_n ~ N(mean, min(var, (bound distance / 2)^2)) truncated at 2 sd, n < N
                        R_n = mean_p sum_{h<H} r_h^(p),  (s_{h+1}, r_h)^(p) ~ p_{b(p,h)}(.|s_h^(p), a_h^n)
                        mean, var <- CEM update on the top ``elites`` of R
                    act mean[0]; shift the mean one step for the next plan (the last step: the action range's middle)
    every train_every env steps:  fit the ensemble on all data

TS-inf: particle p keeps member b(p) = p mod E for the whole horizon; TS-1: the particles are reassigned by a
fresh random permutation at every step. Defaults are the authors' code (github.com/kchua/handful-of-trials,
dmbrl/config/*.py, dmbrl/misc/optimizers/cem.py): E = 5, P = 20 particles, TS-inf, CEM population 500 with 50
elites, 5 iterations, smoothing 0.1, horizon 30, the model fit for 5 epochs after each episode. Departures
(the reward is learned by the ensemble, not given; CPU-sized recipes): docs/classic.md.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Self

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.algo.model_based import cem_update
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.dynamics import DynamicsSettings, ProbabilisticEnsemble, fit, transition_arrays
from reinforge.classic.envs import finished_episodes, flat_obs_dim, next_observations, obs_tensor
from reinforge.classic.networks import action_spec
from reinforge.classic.replay import NStep, Replay, store_vector_step
from reinforge.errors import ConfigError
from reinforge.registry import Settings


def _pets_dynamics() -> DynamicsSettings:
    return DynamicsSettings(members=5, elites=5, hidden=[200, 200, 200], holdout_ratio=0.0, max_epochs=5,
                            max_epochs_since_update=5, batch_size=32)


class PETSSettings(Settings):
    """PETS's options (the authors' handful-of-trials configs)."""

    dynamics: DynamicsSettings = Field(default_factory=_pets_dynamics, description="the dynamics ensemble (PETS: "
                                       "5 members, all used, 5 epochs per fit on all data, batch 32)")
    horizon: int = Field(30, ge=1, description="H: planned steps")
    population: int = Field(500, ge=2, description="N: CEM candidates per iteration")
    elites: int = Field(50, ge=1, description="CEM's top candidates per iteration")
    iterations: int = Field(5, ge=1, description="CEM iterations per environment step")
    smoothing: float = Field(0.1, ge=0, lt=1, description="alpha: mean <- alpha mean + (1 - alpha) elite mean")
    particles: int = Field(20, ge=1, description="P: trajectory samples per candidate (a multiple of the members)")
    propagation: Literal["ts_inf", "ts1"] = Field("ts_inf", description="ts_inf: a member per particle for the "
                                                  "horizon; ts1: members reassigned every step")
    learning_starts: int = Field(1000, ge=0, description="environment steps of uniform random actions first")
    train_every: int = Field(1000, ge=1, description="environment steps between model fits (PETS: an episode)")
    buffer_size: int = Field(1_000_000, ge=1, description="real transitions kept")
    gamma: float = Field(0.99, ge=0, le=1, description="not used by the planner (undiscounted H-step returns); "
                         "the run's reward normalisation reads it")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.elites > self.population:
            raise ValueError(f"elites ({self.elites}) must be at most population ({self.population})")
        if self.particles % self.dynamics.members:
            raise ValueError(f"particles ({self.particles}) must be a multiple of dynamics.members "
                             f"({self.dynamics.members})")
        return self


def _shuffle_within_plans(n: int, particles: int, generator: torch.Generator) -> Tensor:
    """A permutation of the N P rows that moves each particle only among its own plan's P rows (TS-1: every
    plan keeps P / E particles on each member)."""
    perm = torch.argsort(torch.rand(n, particles, generator=generator), dim=1)
    return (perm + torch.arange(n).unsqueeze(1) * particles).reshape(-1)


@torch.no_grad()
def propagate(model: ProbabilisticEnsemble, obs: Tensor, plans: Tensor, particles: int, ts1: bool,
              generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Each of the N P particles' summed sampled rewards [N P] and last states [N P, D] under plans [N, H, A] from
    ``obs`` [D]; particle r follows plan r // P. Laid out [E, N P / E] so that member e predicts its own rows
    only: row r goes to member r mod E (TS-inf: always the same row; TS-1: each plan's rows permuted afresh
    each step)."""
    n, horizon, _ = plans.shape
    e = model.members
    rows = n * particles
    state = obs.reshape(1, -1).expand(rows, -1)
    plan_of = torch.arange(rows) // particles  # particle r belongs to plan r // P, member r % E (TS-inf)
    total = torch.zeros(rows)
    for h in range(horizon):
        order = _shuffle_within_plans(n, particles, generator) if ts1 else torch.arange(rows)
        s, a = state[order], plans[plan_of[order], h]
        x = torch.cat([s, a], -1).reshape(rows // e, e, -1).transpose(0, 1)  # row r -> member r % E
        mean, logvar = model(x)
        draw = mean + (0.5 * logvar).exp() * torch.randn(mean.shape, generator=generator)
        draw = draw.transpose(0, 1).reshape(rows, -1)
        nxt = torch.empty_like(state)
        nxt[order] = s + draw[:, 1:]
        total[order] += draw[:, 0]
        state = nxt
    return total, state


def particle_returns(model: ProbabilisticEnsemble, obs: Tensor, plans: Tensor, particles: int, ts1: bool,
                     generator: torch.Generator) -> Tensor:
    """Mean over ``particles`` of the summed sampled rewards of each plan [N, H, A] -> [N] (NaN -> -1e6)."""
    total, _ = propagate(model, obs, plans, particles, ts1, generator)
    return torch.nan_to_num(total.reshape(len(plans), particles).mean(1), nan=-1e6)


def cem_plan(score: Any, mean: Tensor, low: Tensor, high: Tensor, cfg: PETSSettings,
             generator: torch.Generator) -> Tensor:
    """CEM over action sequences [H, A] from ``mean`` (variance (high - low)^2 / 16, the authors' start); the
    sampling variance is capped so 2 sd stay inside the bounds. ``score(plans [N, H, A]) -> [N]``."""
    var = ((high - low) ** 2 / 16).expand_as(mean).clone()
    for _ in range(cfg.iterations):
        capped = torch.minimum(torch.minimum((mean - low) / 2, (high - mean) / 2).pow(2), var)
        noise = torch.nn.init.trunc_normal_(torch.empty(cfg.population, *mean.shape), generator=generator)
        plans = torch.clamp(mean + noise * capped.sqrt(), low, high)
        mean, var = cem_update(plans, score(plans), cfg.elites, mean, var, cfg.smoothing)
    return mean


@CLASSIC_AGENTS.register(
    "pets", formula="MPC: a_t = mean_0 of CEM over A_{t:t+H} maximising mean_p sum_h r_h^(p), particles p propagated "
                    "through the probabilistic ensemble (TS-inf / TS-1)", paper="1805.12114", settings=PETSSettings)
class PETS:
    """The agent: the ensemble, its optimiser, the real data and each environment's warm-started plan."""

    def __init__(self, envs: Any, seed: int, cfg: PETSSettings) -> None:
        self.cfg, self.envs = cfg, envs
        if action_spec(envs.single_action_space).discrete:
            raise ConfigError(f"classic.agent: pets plans continuous actions; {envs.single_action_space} is not a Box")
        space = getattr(envs, "bounded_action_space", envs.single_action_space)
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ConfigError(f"classic.agent: pets samples actions inside the Box's bounds; {space} has none")
        self.low, self.high = (torch.as_tensor(np.asarray(b), dtype=torch.float32).reshape(1, -1)
                               for b in (space.low, space.high))
        obs_dim, act_dim = flat_obs_dim(envs.single_observation_space), self.low.shape[1]
        torch.manual_seed(seed)
        torch.set_flush_denormal(True)  # the ensemble's training makes denormal floats: 10x slower on x86
        self.model = ProbabilisticEnsemble(obs_dim, act_dim, cfg.dynamics)
        self.net = self.model
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.dynamics.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed + 2)
        self.replay = Replay(cfg.buffer_size, obs_dim, seed, action_dim=act_dim)
        self.nstep = [NStep(1, 1.0, self.replay) for _ in range(envs.num_envs)]
        self.steps_per_iteration = envs.num_envs
        self.env_steps, self.since_fit, self.fitted = 0, 0, False
        self.warm: Tensor | None = None  # [B, H, A] the shifted plans
        obs, _ = envs.reset(seed=seed)
        self.obs = obs_tensor(obs)

    def act(self, obs: Tensor, deterministic: bool = True) -> Tensor:
        """The first action of each row's CEM plan (warm-started by the previous plan, shifted one step)."""
        mid = (self.low + self.high) / 2
        if self.warm is None or len(self.warm) != len(obs):
            self.warm = mid.expand(len(obs), self.cfg.horizon, -1).clone()
        actions = []
        for i in range(len(obs)):
            score = lambda plans, o=obs[i]: particle_returns(  # noqa: E731
                self.model, o, plans, self.cfg.particles, self.cfg.propagation == "ts1", self.generator)
            plan = cem_plan(score, self.warm[i], self.low, self.high, self.cfg, self.generator)
            self.warm[i] = torch.cat([plan[1:], mid])
            actions.append(plan[0])
        return torch.stack(actions)

    def iterate(self, progress: float) -> Iteration:
        """One vector step (planned once the model is fit), then a model fit every ``train_every`` steps."""
        t0 = time.perf_counter()
        if not self.fitted:
            action = np.asarray(self.envs.action_space.sample(), dtype=np.float32)
        else:
            action = self.act(self.obs).numpy()
        obs, reward, terminated, truncated, info = self.envs.step(action)
        store_vector_step(self.nstep, self.obs.numpy(), action, reward, next_observations(obs, info),
                          terminated, truncated)
        ended = np.logical_or(terminated, truncated)
        if self.warm is not None and ended.any():
            self.warm[torch.as_tensor(ended)] = ((self.low + self.high) / 2).expand(self.cfg.horizon, -1)
        self.obs = obs_tensor(obs)
        self.env_steps += self.envs.num_envs
        self.since_fit += self.envs.num_envs
        rollout_s = time.perf_counter() - t0
        metrics: dict[str, float] = {}
        if self.env_steps >= self.cfg.learning_starts and (self.since_fit >= self.cfg.train_every or not self.fitted):
            r, n = self.replay, self.replay.size
            x, y = transition_arrays(r.obs[:n], r.actions[:n], r.rewards[:n], r.next_obs[:n])
            metrics = fit(self.model, self.optimizer, x, y, self.cfg.dynamics, self.rng)
            self.since_fit, self.fitted = 0, True
        return Iteration(finished_episodes(info), metrics, rollout_s)
