"""IMPALA (Espeholt et al. 2018, arXiv:1802.01561) on Gymnasium environments: actors unroll ``unroll_length``
steps with the weights they hold (the behaviour policy mu, with its log-probs), the learner takes one
gradient step per unroll with V-trace targets and advantages (``algo/vtrace.py``), read top to bottom:

    loss = -mean(A_s log pi(a_s|x_s)) + baseline_coef * 0.5 mean((v_s - V(x_s))^2) - ent_coef * mean(H(pi(.|x_s)))

with rho_s = min(rho_bar, pi/mu) inside A_s and c_s = lam min(c_bar, pi/mu) in v_s. ``actors: 0`` unrolls
in this process with the current weights (on-policy: every ratio is 1); ``actors: N`` starts N Ray actor
processes (``classic/impala_actors.py``) that stream unrolls while the learner trains, weights broadcast
by version through Ray's object store after every update; an unroll whose version lags the learner by
more than ``max_staleness`` updates is dropped (the LLM async loop's accounting: ``async/lag_mean``,
``async/lag_max``, ``async/dropped``). Episode ends and bootstraps as for PPO: a truncated episode and
the end of an unroll fold gamma V(x) (the learner's value of the last observation) into the last reward.
Choices the paper leaves to its Atari setup: Adam (the paper: RMSProp) at ``lr`` without decay, the
MLP actor-critic of ``networks.py``, gradient-norm clip 40 (the paper's).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.returns import episode_rows
from reinforge.algo.vtrace import vtrace_returns
from reinforge.classic.agents import CLASSIC_AGENTS, Iteration
from reinforge.classic.envs import obs_tensor
from reinforge.classic.networks import ActorCritic, action_spec
from reinforge.classic.unroll import collect_unroll
from reinforge.registry import Settings


class ImpalaSettings(Settings):
    """IMPALA's hyper-parameters (the paper's V-trace defaults: rho_bar = c_bar = lambda = 1)."""

    actors: int = Field(0, ge=0, description="Ray actor processes unrolling (0: unroll in this process, on-policy)")
    unroll_length: int = Field(32, ge=1, description="steps per environment in one unroll")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount")
    rho_bar: float = Field(1.0, gt=0, description="truncation of the importance weight in delta_s and A_s")
    c_bar: float = Field(1.0, gt=0, description="truncation of the trace coefficients c_s")
    lam: float = Field(1.0, ge=0, le=1, description="lambda of the traces")
    baseline_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    ent_coef: float = Field(0.01, ge=0, description="entropy bonus coefficient")
    max_grad_norm: float = Field(40.0, gt=0, description="global gradient-norm clip")
    max_staleness: int = Field(4, ge=0, description="drop unrolls whose weights lag the learner by more updates")
    hidden: list[int] = Field(default_factory=lambda: [64, 64], min_length=1, description="MLP widths (tanh)")
    ray_address: str | None = Field(None, description="join this Ray cluster (default: start a local Ray)")


def _rows(ends: Tensor, *columns: Tensor) -> tuple[tuple[Tensor, ...], Tensor, Tensor, Tensor]:
    """Time-major [T, E] columns laid out as episode rows (``episode_rows``), their mask and the index."""
    row, col, n, width = episode_rows(ends.T)
    laid = []
    for c in columns:
        x = torch.zeros(n, width, dtype=torch.float64)
        x[row, col] = c.T.double()
        laid.append(x)
    mask = torch.zeros(n, width, dtype=torch.float64)
    mask[row, col] = 1.0
    return tuple(laid), mask, row, col


@CLASSIC_AGENTS.register(
    "impala", formula="V-trace: A_s = rho_s (r_s + gamma v_{s+1} - V(x_s)); "
                      "L = -A_s log pi(a_s|x_s) + c_V (v_s - V(x_s))^2 / 2 - c_H H(pi(.|x_s))",
    paper="1802.01561", settings=ImpalaSettings)
class Impala:
    """The learner: the network, its optimizer and version, and where unrolls come from."""

    def __init__(self, envs: Any, seed: int, cfg: ImpalaSettings, env_cfg: Any = None) -> None:
        self.cfg, self.envs = cfg, envs
        spec = action_spec(envs.single_action_space)
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        torch.manual_seed(seed)
        self.net = ActorCritic(obs_dim, spec, cfg.hidden)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.version, self.dropped = 0, 0
        self.steps_per_iteration = cfg.unroll_length * envs.num_envs
        self.actors = None
        if cfg.actors:
            from reinforge.classic.impala_actors import ImpalaActors

            self.actors = ImpalaActors(cfg, env_cfg, seed, self.net)
        else:
            obs, _ = envs.reset(seed=seed)
            self.obs = obs_tensor(obs)

    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        return self.net.act(obs, self.generator, deterministic=deterministic)[0]

    def iterate(self, progress: float) -> Iteration:
        """One unroll (this process's, or the first an actor returns) and, unless too stale, one update."""
        t0 = time.perf_counter()
        if self.actors is None:
            data, self.obs, episodes = collect_unroll(self.net, self.envs, self.obs, self.cfg.unroll_length,
                                                      self.generator)
            version = self.version
        else:
            data, version, episodes = self.actors.next_unroll()
        rollout_s = time.perf_counter() - t0
        lag = self.version - version
        metrics = {"async/lag_mean": float(lag), "async/lag_max": float(lag)}
        if lag > self.cfg.max_staleness:
            self.dropped += 1
        else:
            metrics.update(self.learn(data))
            self.version += 1
            if self.actors is not None:
                self.actors.publish(self.net, self.version)
        metrics["async/dropped"] = float(self.dropped)
        if self.actors is not None:
            self.actors.resubmit()
        return Iteration(episodes, metrics, rollout_s)

    def learn(self, data: dict[str, np.ndarray]) -> dict[str, float]:
        """One gradient step on an unroll with V-trace targets (module docstring)."""
        cfg = self.cfg
        t = {k: torch.from_numpy(np.array(v)) for k, v in data.items()}  # Ray's arrays are read-only: copies
        steps, e = t["rewards"].shape
        logp, entropy, values = self.net.evaluate(t["obs"].reshape(steps * e, -1),
                                                  t["actions"].reshape(steps * e, *t["actions"].shape[2:]))
        logp, entropy, values = (x.reshape(steps, e) for x in (logp, entropy, values))
        rewards = t["rewards"].double().clone()
        trunc = t["truncated"] & ~t["terminated"]
        with torch.no_grad():
            rewards[trunc] += cfg.gamma * self.net.value(t["final_obs"][trunc]).double()
            ends = t["terminated"] | t["truncated"]
            open_ = ~ends[-1]
            rewards[-1, open_] += cfg.gamma * self.net.value(t["last_obs"][open_]).double()
            ends[-1] = True
        (r, v, log_rhos), mask, row, col = _rows(ends, rewards, values.detach(),
                                                 logp.detach() - t["behavior_logp"])
        vs, adv = vtrace_returns(r, v, log_rhos, mask, cfg.gamma, cfg.rho_bar, cfg.c_bar, cfg.lam)
        vs, adv = vs[row, col].T.float(), adv[row, col].T.float()
        pg_loss = -(adv * logp).mean()
        v_loss = 0.5 * ((vs - values) ** 2).mean()
        loss = pg_loss + cfg.baseline_coef * v_loss - cfg.ent_coef * entropy.mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        ratio = log_rhos[mask.bool()].exp()
        return {"train/policy_loss": pg_loss.item(), "train/value_loss": v_loss.item(),
                "train/entropy": entropy.mean().item(), "train/grad_norm": float(grad_norm),
                "train/rho_mean": ratio.mean().item(), "train/rho_clip_frac": (ratio > cfg.rho_bar).double().mean().item()}

    def close(self) -> None:
        if self.actors is not None:
            self.actors.close()
