"""Offline-RL losses for continuous actions (pure tensor math), for the agents of reinforge/classic/td3bc.py,
cql_box.py and wsrl.py.

TD3+BC (Fujimoto & Gu 2021, "A Minimalist Approach to Offline Reinforcement Learning", arXiv:2106.06860):

    y     = r + (1 - d) g min_j Q'_j(s', clip(pi'(s') + clip(eps, -c, c), low, high)),  eps ~ N(0, sigma^2)
    actor = -lambda mean Q_1(s, pi(s)) + mean ((pi(s) - a) / h)^2,  lambda = alpha / mean |Q_1(s, pi(s))| (no grad)

CQL(H) for continuous actions (Kumar et al. 2020, "Conservative Q-Learning for Offline Reinforcement Learning",
arXiv:2006.04779, eq. 4 with the importance-sampled log-sum-exp of its appendix F):

    penalty_j = mean_s [log sum_k exp(x_k) - Q_j(s, a_data)],  x = [Q_j(s, a_unif) - log U(a_unif),
                Q_j(s, a~pi(s)) - log pi(a|s), Q_j(s, a'~pi(s')) - log pi(a'|s')]   (N samples of each)

Cal-QL (Nakamoto et al. 2023, arXiv:2303.05479) replaces the two policy terms' Q by max(Q, V_mu(s)), V_mu the
logged return-to-go, so the pushed-down values never fall below the behaviour policy's.
"""

from __future__ import annotations

import torch
from torch import Tensor


def smoothed_target_action(next_action: Tensor, noise: Tensor, noise_clip: Tensor | float, low: Tensor,
                           high: Tensor) -> Tensor:
    """TD3's target policy smoothing (Fujimoto et al. 2018, arXiv:1802.09477, eq. 14): the target actor's action
    plus clipped noise, clipped to the Box: clip(pi'(s') + clip(eps, -c, c), low, high). ``noise`` is eps
    already drawn (N(0, sigma^2)); all [B, D] (``noise_clip``, ``low``, ``high`` broadcast)."""
    clipped = torch.maximum(torch.minimum(noise, torch.as_tensor(noise_clip)), -torch.as_tensor(noise_clip))
    return torch.maximum(torch.minimum(next_action + clipped, high), low)


def td3_bc_actor_loss(q_policy: Tensor, policy_action: Tensor, data_action: Tensor, alpha: float,
                      half_width: Tensor | float = 1.0) -> tuple[Tensor, Tensor]:
    """TD3+BC's actor loss and its lambda (arXiv:2106.06860, eq. 3 and section 5):

        L = -lambda mean_i Q(s_i, pi(s_i)) + mean_{i,k} ((pi(s_i)_k - a_ik) / h_k)^2,
        lambda = alpha / mean_i |Q(s_i, pi(s_i))|   (detached: it scales, it is not optimised)

    ``q_policy`` [B] is Q_1 at the actor's actions, ``policy_action`` and ``data_action`` [B, D]; ``h`` the Box's
    half-width, so the behaviour-cloning term is the paper's squared error on actions in [-1, 1] (D4RL's)."""
    lam = alpha / q_policy.abs().mean().detach().clamp(min=1e-8)
    bc = ((policy_action - data_action) / half_width).pow(2).mean()
    return -lam * q_policy.mean() + bc, lam


def cql_continuous_penalty(q_random: Tensor, log_density_random: float | Tensor, q_policy: Tensor,
                           logp_policy: Tensor, q_next_policy: Tensor, logp_next_policy: Tensor,
                           q_data: Tensor, temperature: float = 1.0) -> Tensor:
    """CQL(H)'s regulariser for one critic, importance-sampled (arXiv:2006.04779, appendix F; the authors' code):

        mean_s [T log sum_k exp(x_k / T) - Q(s, a_data)]

    over x = [Q(s, a_u) - log U(a_u) | Q(s, a_pi) - log pi(a_pi|s) | Q(s, a'_pi) - log pi(a'_pi|s')], the
    N samples of each [B, N] (a_u uniform on the Box, a_pi ~ pi(.|s), a'_pi ~ pi(.|s') valued at s); the
    log-probs enter without gradient. ``q_data`` [B]. With T = 1 the paper's log-sum-exp."""
    x = torch.cat([q_random - log_density_random, q_policy - logp_policy.detach(),
                   q_next_policy - logp_next_policy.detach()], dim=-1)
    return (temperature * torch.logsumexp(x / temperature, dim=-1) - q_data).mean()


def calibrate(q_policy: Tensor, reference_value: Tensor) -> Tensor:
    """Cal-QL's calibration (Nakamoto et al. 2023, arXiv:2303.05479, eq. 5.1): max(Q(s, a~pi), V_mu(s)), the
    policy samples' values [B, N] bounded below by a reference value [B] (the logged Monte-Carlo return)."""
    return torch.maximum(q_policy, reference_value.unsqueeze(-1))


def discounted_returns_to_go(rewards: Tensor, episode_ends: Tensor, gamma: float,
                             bootstrap: Tensor | None = None) -> Tensor:
    """sum_{k >= 0} gamma^k r_{t+k} within each episode of flat steps [S] in order (``episode_ends`` [S] true on an
    episode's last step); ``bootstrap`` [S] is added, discounted, after a last step (e.g. a truncation's value;
    zero if None). The Monte-Carlo reference V_mu of Cal-QL."""
    out = torch.zeros_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype)
    for t in range(len(rewards) - 1, -1, -1):
        if bool(episode_ends[t]):
            running = bootstrap[t] if bootstrap is not None else torch.zeros((), dtype=rewards.dtype)
        running = rewards[t] + gamma * running
        out[t] = running
    return out
