"""Conservative Q-Learning for Box actions, CQL(H) (Kumar et al. 2020, "Conservative Q-Learning for Offline
Reinforcement Learning", arXiv:2006.04779), and its calibrated form Cal-QL (Nakamoto et al. 2023,
arXiv:2303.05479): SAC on a logged dataset whose critics also minimise the importance-sampled log-sum-exp of
Q over actions minus Q at the data's action.

    critic:  min E[(Q_j(s, a) - y)^2] + w penalty_j,  y = r + (1 - d) g min_j Q'_j(s', a'),  a' ~ pi(.|s')
             penalty_j = E_s[log sum exp [Q_j(s, a_u) - log U | Q_j(s, a_pi) - log pi | Q_j(s, a'_pi) - log pi]
                         - Q_j(s, a_data)]            (N samples each; Cal-QL: Q_j(s, a_pi) -> max(Q_j, V_mu(s)))
    actor:   min E[alpha log pi(a~|s) - min_j Q_j(s, a~)];  alpha tuned to the target entropy -dim(A)

Defaults are the authors' code for the Gym locomotion runs (and d3rlpy's CQLConfig where the code is silent):
penalty weight w = 5 without the Lagrange variant, N = 10, temperature 1, Adam 1e-4 (actor, alpha) and 3e-4
(critics), batch 256, tau 0.005, gamma 0.99, initial alpha 1, 256-256 ReLU networks, the target without the
entropy term (the code's deterministic_backup) from a sampled next action. V_mu(s) is the logged discounted
return-to-go (classic/offline_box.py; nothing after an episode's last logged step). tensor math:
algo/offline_rl.py.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from pydantic import Field
from torch import Tensor, nn

from reinforge.algo.offline_rl import calibrate, cql_continuous_penalty
from reinforge.algo.qlearning import soft_q_targets
from reinforge.classic.agents import CLASSIC_AGENTS
from reinforge.classic.envs import flat_obs_dim
from reinforge.classic.networks import polyak_update
from reinforge.classic.offline_box import OfflineBoxSettings, OfflineIterations, bounded_box, load_logged
from reinforge.classic.sac import Critics, SACNet, SquashedGaussian


class CQLSettings(OfflineBoxSettings):
    """CQL(H)'s options for Box actions (the authors' locomotion defaults)."""

    cql_weight: float = Field(5.0, ge=0, description="w: the conservative penalty's weight (0: offline SAC)")
    n_action_samples: int = Field(10, ge=1, description="N: uniform and policy actions per state in the log-sum-exp")
    temperature: float = Field(1.0, gt=0, description="T of the log-sum-exp")
    calibrated: bool = Field(False, description="Cal-QL: policy actions' Q bounded below by the logged return-to-go")
    backup_entropy: bool = Field(False, description="subtract alpha log pi(a'|s') in the target (SAC's soft backup)")
    actor_lr: float = Field(1e-4, gt=0, description="Adam learning rate of the actor and alpha")
    critic_lr: float = Field(3e-4, gt=0, description="Adam learning rate of the critics")
    alpha: float = Field(1.0, gt=0, description="entropy temperature (the initial one with autotune)")
    autotune: bool = Field(True, description="tune alpha to the target entropy -dim(A)")


class ConservativeSAC:
    """The CQL / Cal-QL learner on Box actions: actor, twin critics, targets, alpha (``cfg``: CQLSettings-like)."""

    def __init__(self, obs_dim: int, low: Any, high: Any, cfg: CQLSettings, seed: int) -> None:
        self.cfg = cfg
        torch.manual_seed(seed)
        self.actor = SquashedGaussian(obs_dim, cfg.hidden, low, high)
        self.critics = Critics(obs_dim, int(low.size), cfg.hidden)
        self.targets = copy.deepcopy(self.critics)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_lr)
        self.critic_optimizer = torch.optim.Adam(self.critics.parameters(), lr=cfg.critic_lr)
        self.log_alpha = torch.tensor(math.log(cfg.alpha), requires_grad=True)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.actor_lr)
        self.target_entropy = -float(low.size)
        self.low, self.high = torch.as_tensor(low).reshape(1, -1), torch.as_tensor(high).reshape(1, -1)
        self.log_uniform = -float(torch.log(self.high - self.low).sum())
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp()) if self.cfg.autotune else self.cfg.alpha

    def _sampled_q(self, obs: Tensor, policy_obs: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Both critics [B, N] at N actions per state (uniform if ``policy_obs`` is None, else pi(.|policy_obs),
        no gradient into the actor) and the log-densities [B, N] (or the uniform's, broadcast)."""
        b, n = obs.shape[0], self.cfg.n_action_samples
        rep = obs.repeat_interleave(n, 0)
        if policy_obs is None:
            u = torch.rand((b * n, self.low.shape[1]), generator=self.generator)
            actions, logp = self.low + u * (self.high - self.low), torch.full((b, n), self.log_uniform)
        else:
            with torch.no_grad():
                actions, logp = self.actor(policy_obs.repeat_interleave(n, 0), self.generator)
            logp = logp.reshape(b, n)
        q1, q2 = self.critics(rep, actions)
        return q1.reshape(b, n), q2.reshape(b, n), logp

    def critic_loss(self, t: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        with torch.no_grad():
            next_action, next_logp = self.actor(t["next_obs"], self.generator)
            q1_next, q2_next = self.targets(t["next_obs"], next_action)
            alpha = self.alpha if self.cfg.backup_entropy else 0.0
            y = soft_q_targets(t["rewards"], torch.full_like(t["rewards"], self.cfg.gamma), t["terminated"],
                               torch.minimum(q1_next, q2_next), next_logp, alpha)
        q_data = self.critics(t["obs"], t["actions"])
        td = sum(nn.functional.mse_loss(q, y) for q in q_data)
        if self.cfg.cql_weight == 0:
            return td, {"train/q_loss": td.item() / 2, "train/q_mean": q_data[0].mean().item()}
        rand, pol, nxt = (self._sampled_q(t["obs"], o) for o in (None, t["obs"], t["next_obs"]))
        penalty = t["rewards"].new_zeros(())
        for j in range(2):
            q_pi, q_next_pi = pol[j], nxt[j]
            if self.cfg.calibrated:
                q_pi, q_next_pi = calibrate(q_pi, t["returns_to_go"]), calibrate(q_next_pi, t["returns_to_go"])
            penalty = penalty + cql_continuous_penalty(rand[j], rand[2], q_pi, pol[2], q_next_pi, nxt[2], q_data[j],
                                                       self.cfg.temperature)
        return td + self.cfg.cql_weight * penalty, {"train/q_loss": td.item() / 2, "train/cql_penalty": penalty.item() / 2,
                                                    "train/q_mean": q_data[0].mean().item()}

    def actor_step(self, obs: Tensor) -> dict[str, float]:
        action, logp = self.actor(obs, self.generator)
        actor_loss = (self.alpha * logp - torch.minimum(*self.critics(obs, action))).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()
        metrics = {"train/actor_loss": actor_loss.item(), "train/entropy": -logp.mean().item(), "train/alpha": self.alpha}
        if self.cfg.autotune:
            alpha_loss = (-self.log_alpha.exp() * (logp.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()
        return metrics

    def critic_step(self, t: dict[str, Tensor]) -> dict[str, float]:
        """A critic step (TD + w penalty) and the targets' Polyak update."""
        loss, metrics = self.critic_loss(t)
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        polyak_update(self.targets, self.critics, self.cfg.tau)
        return metrics

    def gradient_step(self, t: dict[str, Tensor]) -> dict[str, float]:
        """A critic step, then an actor and alpha step on the same batch."""
        return {**self.critic_step(t), **self.actor_step(t["obs"])}


@CLASSIC_AGENTS.register(
    "cql", formula="min E[(Q_j(s,a) - (r + (1-d) g min_j Q'_j(s',a')))^2] + w E_s[log sum_a exp Q_j(s,a) - Q_j(s,a_data)] "
                   "(importance-sampled; calibrated: max(Q, V_mu)); max E[min_j Q_j(s,a~) - alpha log pi(a~|s)]",
    paper="2006.04779", settings=CQLSettings)
class CQL(OfflineIterations):
    """The agent for Box actions (discrete CQL(H): classic/cql.py's fit_cql): the logged data and the learner."""

    def __init__(self, envs: Any, seed: int, cfg: CQLSettings) -> None:
        self.cfg, self.envs = cfg, envs
        low, high = bounded_box(envs, "cql")
        self.data = load_logged(cfg.offline_data, envs, cfg.gamma, seed)
        self.learner = ConservativeSAC(flat_obs_dim(envs.single_observation_space), low, high, cfg, seed)
        self.net = SACNet(self.learner.actor, self.learner.critics)
        self.optimizer, self.generator = self.learner.critic_optimizer, self.learner.generator
        self.steps_per_iteration = cfg.iteration_steps

    @torch.no_grad()
    def act(self, obs: Tensor, deterministic: bool) -> Tensor:
        """The policy's action (tanh of the mean if ``deterministic``)."""
        return self.learner.actor(obs, self.generator, deterministic)[0]

    def gradient_step(self, batch: dict[str, Tensor]) -> dict[str, float]:
        return self.learner.gradient_step(batch)
