"""Fitted Q Evaluation (Le, Voloshin & Yue 2019, "Batch Policy Learning under Constraints",
arXiv:1903.08738): the value of a target policy pi from logged transitions alone, by repeated regression

    Q_{k+1} = argmin_Q sum_i (Q(s_i, a_i) - [r_i + gamma (1 - d_i) sum_a' pi(a' | s'_i) Q_k(s'_i, a')])^2

for discrete actions, with pi the epsilon-soft policy of a greedy agent (classic/offline.py). Each of
``iterations`` rounds takes ``steps`` Adam steps on mini-batches against the frozen previous Q_k (a
target network, as in DQN): each round reaches one step further, so the rounds must exceed the
effective horizon 1 / (1 - gamma) (30 rounds valued CartPole at gamma 0.99 near 26, the 30-step
sum). V(pi) = mean over logged first states of sum_a pi(a | s_0) Q(s_0, a); Q(s_t, a_t) and V(s_t)
on every logged step are the model terms of the doubly robust estimator.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from reinforge.classic.dqn import q_network
from reinforge.classic.offline import Logged

Policy = Callable[[Tensor], Tensor]  # obs [B, D] -> pi(. | s) [B, A]


def fit_fqe(data: Logged, policy: Policy, n_actions: int, gamma: float, iterations: int = 300, steps: int = 50,
            batch: int = 256, lr: float = 1e-3, hidden: list[int] | None = None, seed: int = 0) -> nn.Module:
    """A Q network fitted to pi's action values on ``data``."""
    torch.manual_seed(seed)
    q = q_network(data.obs.shape[1], hidden or [64, 64], n_actions)
    opt = torch.optim.Adam(q.parameters(), lr=lr)
    obs, next_obs, action, reward, done = data.transitions()
    with torch.no_grad():
        pi_next = policy(next_obs).float()
    rng = np.random.default_rng(seed)
    for _ in range(iterations):
        frozen = copy.deepcopy(q)
        with torch.no_grad():
            target = reward + gamma * (1 - done) * (pi_next * frozen(next_obs)).sum(-1)
        for _ in range(steps):
            i = torch.from_numpy(rng.integers(0, len(reward), batch))
            loss = nn.functional.mse_loss(q(obs[i]).gather(-1, action[i, None]).squeeze(-1), target[i])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return q


@torch.no_grad()
def fqe_terms(q: nn.Module, data: Logged, policy: Policy) -> tuple[Tensor, Tensor, float]:
    """Q(s_t, a_t) and V(s_t) = sum_a pi(a|s_t) Q(s_t, a) as [N, T] (``Logged.padded``), and FQE's own
    estimate of V(pi): the mean of V over the logged first states."""
    obs = torch.from_numpy(data.obs)
    values = q(obs)
    taken = values.gather(-1, torch.as_tensor(data.action, dtype=torch.int64)[:, None]).squeeze(-1)
    v = (policy(obs).float() * values).sum(-1)
    q_taken, _ = data.padded(taken.numpy())
    v_pi, _ = data.padded(v.numpy())
    return q_taken, v_pi, float(v_pi[:, 0].mean())
