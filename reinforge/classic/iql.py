"""Offline RL from logged data (classic/offline.py) with Implicit Q-Learning for discrete actions (Kostrikov,
Nair & Levine 2021, "Offline Reinforcement Learning with Implicit Q-Learning", arXiv:2110.06169). IQL never
evaluates an action the data did not take: each step of Adam on a mini-batch of logged (s, a, r, s', d)

    V:   min E[L_2^tau(min_j Q'_j(s, a) - V(s))]                  (expectile regression, algo.expectile_loss)
    Q_j: min E[(r + gamma (1 - d) V(s') - Q_j(s, a))^2]           (a SARSA-like backup through V, not max Q)
    pi:  min -E[min(exp(beta (min_j Q'_j(s, a) - V(s))), 100) log pi(a | s)]   (AWR, algo.awr_weights)

with twin Q networks and their Polyak-averaged targets Q'_j (rate ``target_tau``), as the paper's code.
The greedy policy is argmax_a pi(a | s) (the returned network's logits). Choices the paper leaves to the
setting (docs/classic.md): discrete actions, so pi is a categorical MLP and its log-likelihood exact;
no reward normalisation (the paper rescales MuJoCo returns to a 1000-wide range; CartPole's rewards are
1 per step); a constant learning rate for pi (the paper anneals it with a cosine schedule).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from reinforge.algo.qlearning import awr_weights, expectile_loss, q_learning_targets
from reinforge.classic.dqn import q_network
from reinforge.classic.networks import polyak_update
from reinforge.classic.offline import Logged


def fit_iql(data: Logged, n_actions: int, gamma: float = 0.99, expectile: float = 0.7, beta: float = 3.0,
            steps: int = 10_000, batch: int = 256, lr: float = 3e-4, target_tau: float = 0.005,
            max_weight: float = 100.0, hidden: list[int] | None = None,
            seed: int = 0) -> tuple[nn.Module, dict[str, float], dict[str, nn.Module]]:
    """The policy network (obs -> logits) trained on ``data`` alone, the last step's losses, and the value
    networks ``{"q1", "q2", "v"}``."""
    torch.manual_seed(seed)
    width = hidden or [256, 256]
    dim = data.obs.shape[1]
    q1, q2, v, pi = (q_network(dim, width, n_actions), q_network(dim, width, n_actions), q_network(dim, width, 1),
                     q_network(dim, width, n_actions))
    q1_t, q2_t = copy.deepcopy(q1), copy.deepcopy(q2)
    opt_q = torch.optim.Adam([*q1.parameters(), *q2.parameters()], lr=lr)
    opt_v, opt_pi = torch.optim.Adam(v.parameters(), lr=lr), torch.optim.Adam(pi.parameters(), lr=lr)
    obs, next_obs, action, reward, done = data.transitions()
    discount = torch.full_like(reward, gamma)
    rng = np.random.default_rng(seed)
    for _ in range(max(steps, 1)):
        i = torch.from_numpy(rng.integers(0, len(reward), batch))
        s, a = obs[i], action[i, None]
        with torch.no_grad():
            q_target = torch.min(q1_t(s), q2_t(s)).gather(-1, a).squeeze(-1)
        value = v(s).squeeze(-1)
        v_loss = expectile_loss(q_target - value, expectile)
        with torch.no_grad():  # one action column: the "argmax" of q_learning_targets is V(s') itself
            y = q_learning_targets(reward[i], discount[i], done[i], v(next_obs[i]))
        q_loss = sum(nn.functional.mse_loss(q(s).gather(-1, a).squeeze(-1), y) for q in (q1, q2))
        weights = awr_weights(q_target - value.detach(), beta, max_weight)
        pi_loss = -(weights * torch.log_softmax(pi(s), -1).gather(-1, a).squeeze(-1)).mean()
        for opt, loss in ((opt_v, v_loss), (opt_q, q_loss), (opt_pi, pi_loss)):
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        polyak_update(q1_t, q1, target_tau)
        polyak_update(q2_t, q2, target_tau)
    stats = {"v_loss": v_loss.item(), "q_loss": q_loss.item(), "pi_loss": pi_loss.item(),
             "weight_mean": weights.mean().item()}
    return pi, stats, {"q1": q1, "q2": q2, "v": v}
