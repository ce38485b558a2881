"""Q-learning targets and offline-RL losses (pure tensor math), for value-based agents (reinforge/classic/dqn.py,
cql.py, iql.py).

    y = R + (1 - d) * g * Q_target(s', a*)

with R the (n-step) discounted reward sum, g = gamma^k the discount of the bootstrap (k <= n steps
were summed), d = 1 when the episode terminated within those steps (a truncation bootstraps, d = 0),
and a* = argmax_a Q_target(s', a) (DQN, Mnih et al. 2015, Nature 518) or argmax_a Q_online(s', a)
(double Q-learning, van Hasselt et al. 2016, arXiv:1509.06461: the online network picks the action,
the target network values it, which removes max's upward bias).
"""

from __future__ import annotations

import torch
from torch import Tensor


def q_learning_targets(rewards: Tensor, discounts: Tensor, terminated: Tensor, next_q_target: Tensor,
                       next_q_online: Tensor | None = None) -> Tensor:
    """``y`` [B] from rewards, bootstrap discounts and terminated flags [B] and the next states' action
    values [B, A] of the target network (and of the online network for double Q). No gradient."""
    with torch.no_grad():
        bootstrap = greedy_values(next_q_target, next_q_online)
        return rewards + (1.0 - terminated.to(rewards.dtype)) * discounts * bootstrap


def greedy_values(next_q_target: Tensor, next_q_online: Tensor | None = None) -> Tensor:
    """Q_target(s', a*) [...] from action values [..., A], a* = argmax of the online values if given
    (double Q), else of the target's. No gradient."""
    with torch.no_grad():
        pick = next_q_online if next_q_online is not None else next_q_target
        return next_q_target.gather(-1, pick.argmax(-1, keepdim=True)).squeeze(-1)


def vdn_q_total(q_agents: Tensor, actions: Tensor) -> Tensor:
    """VDN's joint value (Sunehag et al. 2017, arXiv:1706.05296): Q_tot(o, a) = sum_i Q_i(o_i, a_i), from
    per-agent action values [B, N, A] and the joint action [B, N] -> [B] (with gradient)."""
    return q_agents.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1).sum(-1)


def vdn_targets(rewards: Tensor, discounts: Tensor, terminated: Tensor, next_q_target: Tensor,
                next_q_online: Tensor | None = None) -> Tensor:
    """VDN's TD target on the team reward: the max of a sum of per-agent terms is the sum of their maxes,

        y = R + (1 - d) g sum_i Q'_i(o'_i, a*_i),  a*_i = argmax_a Q'_i(o'_i, a) (or Q_i's, double Q)

    from rewards, discounts and terminated flags [B] and next per-agent action values [B, N, A]. No gradient."""
    with torch.no_grad():
        bootstrap = greedy_values(next_q_target, next_q_online).sum(-1)
        return rewards + (1.0 - terminated.to(rewards.dtype)) * discounts * bootstrap


def n_step_return(rewards: list[float], gamma: float) -> tuple[float, float]:
    """(sum_i gamma^i r_i, gamma^k) for the k rewards of an n-step transition (k <= n)."""
    total, discount = 0.0, 1.0
    for r in rewards:
        total += discount * r
        discount *= gamma
    return total, discount


def soft_q_targets(rewards: Tensor, discounts: Tensor, terminated: Tensor, next_q_min: Tensor, next_logp: Tensor,
                   alpha: float | Tensor) -> Tensor:
    """SAC's soft target (Haarnoja et al. 2018, arXiv:1801.01290 and 1812.05905, with the clipped double Q
    of TD3, Fujimoto et al. 2018, arXiv:1802.09477):

        y = R + (1 - d) g (min_j Q'_j(s', a') - alpha log pi(a' | s')),  a' ~ pi(. | s')

    ``next_q_min`` [B] the smaller target-network value of a', ``next_logp`` [B] its log-prob. No gradient."""
    with torch.no_grad():
        soft = next_q_min - alpha * next_logp
        return rewards + (1.0 - terminated.to(rewards.dtype)) * discounts * soft


def cql_penalty(q_all: Tensor, actions: Tensor) -> Tensor:
    """Conservative Q-learning's regulariser for discrete actions, CQL(H) (Kumar et al. 2020,
    arXiv:2006.04779, eq. 4): E_s[log sum_a exp Q(s, a) - Q(s, a_data)] over the batch, which pushes
    down the values of actions the data does not support. ``q_all`` [B, A], ``actions`` [B]."""
    taken = q_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(q_all, -1) - taken).mean()


def expectile_loss(diff: Tensor, expectile: float) -> Tensor:
    """Implicit Q-learning's value loss (Kostrikov, Nair & Levine 2021, arXiv:2110.06169, eq. 5):
    mean of L_2^tau(u) = |tau - 1(u < 0)| u^2 with u = Q_target(s, a) - V(s) over the batch. With
    tau = 0.5 it is half the squared error (V the mean of Q over the data's actions); tau -> 1 pushes V
    towards the largest Q among the actions the data took. ``diff`` [B]."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


def awr_weights(advantages: Tensor, beta: float, max_weight: float = 100.0) -> Tensor:
    """Advantage-weighted regression's weights for IQL's policy extraction (arXiv:2110.06169, eq. 7;
    Peng et al. 2019, arXiv:1910.00177): w = min(exp(beta (Q(s, a) - V(s))), max_weight), the policy loss
    being -mean(w log pi(a | s)) over the data's actions. ``beta`` is the inverse temperature (0: behaviour
    cloning); the clip at ``max_weight`` (100 in the paper's code) keeps one large advantage from
    dominating a batch. No gradient."""
    with torch.no_grad():
        return torch.exp(beta * advantages).clamp(max=max_weight)
