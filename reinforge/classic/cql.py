"""Offline RL from logged data (classic/offline.py) with Conservative Q-Learning for discrete actions,
CQL(H) (Kumar et al. 2020, arXiv:2006.04779): DQN's regression on the logged transitions plus
alpha * E_s[log sum_a exp Q(s, a) - Q(s, a_data)] (``algo/qlearning.cql_penalty``), so the greedy policy
stays on actions the data supports. ``alpha = 0`` is plain offline DQN (the baseline CQL improves on).
Targets y = r + gamma (1 - d) max_a Q_target(s', a) (double Q as an option), a hard target copy every
``target_every`` steps, Adam; the logged ``next_obs`` of an episode's last step is its final observation,
so a truncated episode bootstraps and a terminated one does not.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from reinforge.algo.qlearning import cql_penalty, q_learning_targets
from reinforge.classic.dqn import q_network
from reinforge.classic.offline import Logged


def fit_cql(data: Logged, n_actions: int, gamma: float = 0.99, alpha: float = 1.0, steps: int = 10_000,
            batch: int = 256, lr: float = 3e-4, target_every: int = 500, double_q: bool = True,
            hidden: list[int] | None = None, seed: int = 0) -> tuple[nn.Module, dict[str, float]]:
    """A Q network trained on ``data`` alone; returns it and the last step's losses."""
    torch.manual_seed(seed)
    q = q_network(data.obs.shape[1], hidden or [256, 256], n_actions)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    obs, next_obs, action, reward, done = data.transitions()
    ones = torch.full_like(reward, gamma)
    rng = np.random.default_rng(seed)
    stats: dict[str, float] = {}
    for step in range(steps):
        i = torch.from_numpy(rng.integers(0, len(reward), batch))
        q_all = q(obs[i])
        with torch.no_grad():
            online = q(next_obs[i]) if double_q else None
            y = q_learning_targets(reward[i], ones[i], done[i], target(next_obs[i]), online)
        td = nn.functional.mse_loss(q_all.gather(-1, action[i, None]).squeeze(-1), y)
        penalty = cql_penalty(q_all, action[i])
        loss = td + alpha * penalty
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % target_every == 0:
            target.load_state_dict(q.state_dict())
        stats = {"td_loss": td.item(), "cql_penalty": penalty.item()}
    return q, stats
