"""MBPO (Janner, Fu, Zhang & Levine 2019, "When to Trust Your Model: Model-Based Policy Optimization",
arXiv:1906.08253): SAC (classic/sac.py, reused as is) trained mostly on short rollouts of a learned
probabilistic dynamics ensemble (classic/dynamics.py) branched from real states. Read top to bottom: the
settings, the termination functions, ``model_rollout``, the agent.

    every model_train_freq env steps:  fit the ensemble on all real data (elites by held-out MSE);
        from rollout_batch_size real states s_0 ~ D_env:  a_t ~ pi(.|s_t), (s_{t+1}, r_t) ~ p_e(.|s_t, a_t),
        e a random elite per row, for t < k (a row stops when it terminates); every step into D_model
    every env step:  G SAC updates, each on a batch of real_ratio N real and (1 - real_ratio) N model transitions

k follows the authors' linear schedule in the epoch (``algo/model_based.rollout_length``); D_model holds
``model_retain_epochs`` epochs of rollouts. Defaults are the authors' code (github.com/jannerm/mbpo: the
``MBPO`` class, mbpo/models, examples/config/*): E = 7, 5 elites, four 200-wide swish layers, real ratio 0.05,
model every 250 steps, 1e5 rollouts, G = 20, SAC lr 3e-4 with the actor updated every critic step.
Departures: docs/classic.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Self

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from reinforge.algo.model_based import rollout_length
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.dynamics import (
    DynamicsSettings,
    ProbabilisticEnsemble,
    fit,
    sample_step,
    transition_arrays,
)
from reinforge.classic.replay import Replay
from reinforge.classic.sac import SAC, SACSettings
from reinforge.errors import ConfigError

DoneFn = Callable[[Tensor], Tensor]  # next observations [B, D] -> terminated [B] (bool)


def _never(next_obs: Tensor) -> Tensor:
    return torch.zeros(len(next_obs), dtype=torch.bool)


def _inverted_pendulum(next_obs: Tensor) -> Tensor:
    return ~(torch.isfinite(next_obs).all(-1) & (next_obs[:, 1].abs() <= 0.2))


def _hopper(next_obs: Tensor) -> Tensor:
    ok = torch.isfinite(next_obs).all(-1) & (next_obs[:, 1:].abs() < 100).all(-1)
    return ~(ok & (next_obs[:, 0] > 0.7) & (next_obs[:, 1].abs() < 0.2))


# the authors' mbpo/static/*.py termination functions, by Gymnasium id without its version
TERMINATIONS: dict[str, DoneFn] = {"Pendulum": _never, "HalfCheetah": _never, "InvertedPendulum": _inverted_pendulum,
                                   "Hopper": _hopper, "Swimmer": _never, "reinforge/PointReach": _never}


def _known_termination(env_id: str) -> DoneFn:
    fn = TERMINATIONS.get(env_id.rsplit("-v", 1)[0])
    if fn is None:
        raise ConfigError(f"classic.agent.termination: no termination function for {env_id!r} (known: "
                          f"{', '.join(sorted(TERMINATIONS))}); set `none` if its episodes only time out")
    return fn


_TERMINATION_SETTINGS: dict[str, Callable[[str], DoneFn]] = {"auto": _known_termination, "none": lambda _: _never}


def termination_fn(env_id: str, setting: str) -> DoneFn:
    """The environment's known termination rule (``auto``) or none (``none``); an unknown id is an error."""
    return _TERMINATION_SETTINGS[setting](env_id)


class MBPOSettings(SACSettings):
    """MBPO's options: SAC's (with the authors' values) and the model's (jannerm/mbpo defaults)."""

    q_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the critics")
    policy_frequency: int = Field(1, ge=1, description="critic steps per actor update")
    gradient_steps: int = Field(20, ge=1, description="G: SAC updates per environment step (n_train_repeat)")
    dynamics: DynamicsSettings = Field(default_factory=DynamicsSettings, description="the dynamics ensemble")
    real_ratio: float = Field(0.05, ge=0, le=1, description="share of each SAC batch from real transitions")
    model_train_freq: int = Field(250, ge=1, description="environment steps between model fits and rollouts")
    rollout_batch_size: int = Field(100_000, ge=1, description="real start states per round of model rollouts")
    epoch_length: int = Field(1000, ge=1, description="environment steps per epoch (the schedule's unit)")
    rollout_schedule: list[int] = Field(default_factory=lambda: [20, 100, 1, 1], min_length=4, max_length=4,
                                        description="[min epoch, max epoch, min k, max k]: k linear in between")
    model_retain_epochs: int = Field(1, ge=1, description="epochs of model rollouts the model buffer holds")
    termination: Literal["auto", "none"] = Field("auto", description="auto: the environment's known termination "
                                                 "function (Pendulum, HalfCheetah, InvertedPendulum, Hopper, ...); "
                                                 "none: model rollouts never terminate")

    @model_validator(mode="after")
    def _one_step_no_her(self) -> Self:
        if self.n_step != 1 or self.her is not None:
            raise ValueError("mbpo trains on 1-step model transitions: n_step must be 1 and her off")
        if self.dynamics.elites > self.dynamics.members:
            raise ValueError(f"dynamics.elites ({self.dynamics.elites}) must be at most dynamics.members "
                             f"({self.dynamics.members})")
        lo, hi, k_lo, k_hi = self.rollout_schedule
        if hi < lo or min(k_lo, k_hi) < 1:
            raise ValueError(f"rollout_schedule: need min epoch <= max epoch and k >= 1 (got {self.rollout_schedule})")
        return self


@torch.no_grad()
def model_rollout(model: ProbabilisticEnsemble, policy: Callable[[Tensor], Tensor], start: Tensor, length: int,
                  done_fn: DoneFn, generator: torch.Generator) -> dict[str, np.ndarray]:
    """k-step model rollouts from ``start`` [B, D]: all their transitions (a row that terminates is stored with
    terminated = 1 and not continued), as numpy arrays for ``Replay.add_batch``."""
    obs, out = start, {k: [] for k in ("obs", "actions", "rewards", "next_obs", "terminated")}
    for _ in range(length):
        actions = policy(obs)
        next_obs, rewards = sample_step(model, obs, actions, generator)
        done = done_fn(next_obs)
        for k, v in zip(out, (obs, actions, rewards, next_obs, done.float()), strict=True):
            out[k].append(v)
        obs = next_obs[~done]
        if len(obs) == 0:
            break
    return {k: torch.cat(v).numpy() for k, v in out.items()}


class MBPONet(nn.Module):
    """What a checkpoint saves: the actor, the critics and the dynamics ensemble."""

    def __init__(self, actor: nn.Module, critics: nn.Module, model: ProbabilisticEnsemble) -> None:
        super().__init__()
        self.actor, self.critics, self.model = actor, critics, model


@CLASSIC_AGENTS.register(
    "mbpo", formula="fit p_e(r, s'-s | s, a) by Gaussian NLL; k-step branched rollouts a~pi, e~elites into D_model; "
                    "G SAC updates per env step on real_ratio D_env + (1-real_ratio) D_model",
    paper="1906.08253", settings=MBPOSettings)
class MBPO(SAC):
    """SAC plus the dynamics ensemble, its optimiser and the model buffer."""

    def __init__(self, envs: Any, seed: int, cfg: MBPOSettings, env_cfg: Any = None) -> None:
        super().__init__(envs, seed, cfg)
        torch.set_flush_denormal(True)  # the ensemble's training makes denormal floats: 10x slower on x86
        self.cfg: MBPOSettings = cfg
        self.done_fn = termination_fn(env_cfg.id if env_cfg is not None else "", cfg.termination)
        act_dim = self.replay.actions.shape[1]
        self.model = ProbabilisticEnsemble(self.replay.obs.shape[1], act_dim, cfg.dynamics)
        self.model_optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.dynamics.lr)
        self.net = MBPONet(self.actor, self.critics, self.model)
        self.rng = np.random.default_rng(seed + 2)
        self.model_replay = Replay(1, self.replay.obs.shape[1], seed + 3, action_dim=act_dim)
        self.since_model = 0

    def iterate(self, progress: float) -> Iteration:
        """One vector step; every ``model_train_freq`` steps (from ``learning_starts``) a model fit and a round
        of rollouts; then ``gradient_steps`` SAC updates on mixed batches."""
        t0 = time.perf_counter()
        episodes = self._env_step()
        rollout_s = time.perf_counter() - t0
        self.since_model += self.envs.num_envs
        metrics: dict[str, float] = {}
        if self.env_steps >= self.cfg.learning_starts and (self.since_model >= self.cfg.model_train_freq
                                                            or self.model_replay.size == 0):
            metrics.update(self.train_model())
            metrics.update(self.rollout())
            self.since_model = 0
        if self.env_steps > self.cfg.learning_starts:
            for _ in range(self.cfg.gradient_steps):
                metrics.update(self.gradient_step(self.mixed_batch()))
        return Iteration(episodes, metrics, rollout_s)

    def train_model(self) -> dict[str, float]:
        """Fit the ensemble on every real transition so far (continuing from its current weights)."""
        r, n = self.replay, self.replay.size
        x, y = transition_arrays(r.obs[:n], r.actions[:n], r.rewards[:n], r.next_obs[:n])
        return fit(self.model, self.model_optimizer, x, y, self.cfg.dynamics, self.rng)

    def rollout(self) -> dict[str, float]:
        """k-step rollouts from ``rollout_batch_size`` real states into the model buffer (resized to hold
        ``model_retain_epochs`` epochs of them at this k)."""
        c = self.cfg
        k = rollout_length(self.env_steps // c.epoch_length, *c.rollout_schedule)
        rounds = max(1, c.epoch_length // c.model_train_freq)
        self._resize_model_replay(c.model_retain_epochs * rounds * c.rollout_batch_size * k)
        start = torch.from_numpy(self.replay.sample(c.rollout_batch_size)["obs"])
        out = model_rollout(self.model, lambda o: self.actor(o, self.generator)[0], start, k, self.done_fn,
                            self.generator)
        self.model_replay.add_batch(out["obs"], out["actions"], out["rewards"], out["next_obs"], out["terminated"],
                                    c.gamma)
        return {"model/rollout_length": float(k), "model/rollout_steps_mean": len(out["obs"]) / c.rollout_batch_size,
                "model/buffer_size": float(self.model_replay.size)}

    def _resize_model_replay(self, capacity: int) -> None:
        old = self.model_replay
        if old.capacity == capacity:
            return
        order = np.arange(old.size) if old.size < old.capacity else (old.pos + np.arange(old.size)) % old.capacity
        self.model_replay = Replay(capacity, old.obs.shape[1], 0, action_dim=old.actions.shape[1])
        self.model_replay.rng = old.rng
        if old.size:
            self.model_replay.add_batch(old.obs[order], old.actions[order], old.rewards[order], old.next_obs[order],
                                        old.terminated[order], self.cfg.gamma)

    def mixed_batch(self) -> dict[str, np.ndarray]:
        """int(real_ratio N) real transitions and the rest from the model buffer (all real while it is empty)."""
        n = self.cfg.batch_size
        n_real = n if self.model_replay.size == 0 else int(n * self.cfg.real_ratio)
        parts = [b.sample(m) for b, m in ((self.replay, n_real), (self.model_replay, n - n_real)) if m > 0]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
