"""Model-based RL's tensor math (pure functions), for the probabilistic dynamics ensemble and the planners of
reinforge/classic/ (dynamics.py, mbpo.py, pets.py).

Probabilistic ensemble (Chua et al. 2018, PETS, arXiv:1805.12114; Janner et al. 2019, MBPO, arXiv:1906.08253):
each member outputs a mean mu and a raw log-variance v per target dimension; the log-variance is softly
bounded by learned limits (the authors' ``bnn.py``)

    log s^2 = max_lv - softplus(max_lv - v);   log s^2 <- min_lv + softplus(log s^2 - min_lv)

and each member minimises the Gaussian negative log-likelihood (without the constant 1/2 log 2 pi and the
factor 1/2), averaged over the batch and the dimensions, plus 0.01 (sum max_lv - sum min_lv):

    NLL_e = mean_{b, d} [ (mu - y)^2 exp(-log s^2) + log s^2 ]

The elites are the members with the smallest held-out MSE. CEM (the cross-entropy method, Rubinstein 1999;
PETS's optimiser): the new sampling distribution moves to the top-k candidates' mean and variance, smoothed:

    mean <- a mean + (1 - a) mean(elites);   var <- a var + (1 - a) var(elites)
"""

from __future__ import annotations

import torch
from torch import Tensor


def bound_log_variance(raw: Tensor, min_logvar: Tensor, max_logvar: Tensor) -> Tensor:
    """The raw log-variance softly clamped into (min_logvar, max_logvar) (differentiable in all three)."""
    logvar = max_logvar - torch.nn.functional.softplus(max_logvar - raw)
    return min_logvar + torch.nn.functional.softplus(logvar - min_logvar)


def gaussian_nll(mean: Tensor, logvar: Tensor, target: Tensor) -> Tensor:
    """Each member's Gaussian NLL [E] from means and log-variances [E, B, D] and targets [B, D] or [E, B, D]:
    mean over b, d of (mu - y)^2 exp(-log s^2) + log s^2 (twice the NLL less its constant)."""
    return ((mean - target).pow(2) * torch.exp(-logvar) + logvar).mean((-2, -1))


def logvar_bound_penalty(min_logvar: Tensor, max_logvar: Tensor, weight: float = 0.01) -> Tensor:
    """weight (sum max_lv - sum min_lv): keeps the learned bounds tight (the authors' 0.01)."""
    return weight * (max_logvar.sum() - min_logvar.sum())


def member_mse(mean: Tensor, target: Tensor) -> Tensor:
    """Each member's mean squared error [E] (the held-out score that picks the elites)."""
    return (mean - target).pow(2).mean((-2, -1))


def elite_indices(losses: Tensor, k: int) -> Tensor:
    """The indices of the ``k`` smallest losses [E], best first."""
    if not 1 <= k <= losses.numel():
        raise ValueError(f"elites: k={k} must be in 1..{losses.numel()}")
    return torch.argsort(losses)[:k]


def rollout_length(epoch: int, min_epoch: int, max_epoch: int, min_length: int, max_length: int) -> int:
    """MBPO's schedule: ``min_length`` up to ``min_epoch``, then linear in the epoch to ``max_length`` at
    ``max_epoch`` (and after), rounded down (the authors' ``_set_rollout_length``)."""
    if epoch <= min_epoch:
        return min_length
    share = min((epoch - min_epoch) / max(max_epoch - min_epoch, 1), 1.0)
    return int(share * (max_length - min_length) + min_length)


def cem_update(candidates: Tensor, scores: Tensor, num_elites: int, mean: Tensor, var: Tensor,
               smoothing: float) -> tuple[Tensor, Tensor]:
    """One CEM step: candidates [N, ...] with scores [N] (higher is better) -> the smoothed mean and variance
    of the ``num_elites`` best (population variance, as the PETS code's ``np.var``)."""
    elites = candidates[torch.topk(scores, num_elites).indices]
    new_mean = smoothing * mean + (1 - smoothing) * elites.mean(0)
    new_var = smoothing * var + (1 - smoothing) * elites.var(0, unbiased=False)
    return new_mean, new_var
