"""TROLL: PPO's ratio clip replaced by a differentiable KL trust-region projection of each token's distribution.

Becker, Freymuth et al. 2025, "TROLL: Trust Regions improve Reinforcement Learning for Large Language
Models" (arXiv:2510.03817). At every trained token the new next-token distribution pi is projected onto
the KL ball of radius eps around the old one, on a sparse support S (the K most probable tokens of pi_old,
the taken token always among them), both renormalised over S:

    pi~ = argmin_q KL(q || pi)  s.t.  KL(q || pi_old) <= eps
        = pi                                     if KL(pi || pi_old) <= eps,
        ~ pi^(1/(1+eta)) pi_old^(eta/(1+eta))    else, eta > 0 solving KL(pi~ || pi_old) = eps,

a geometric interpolation from pi (eta = 0) to pi_old (eta -> inf). eta is found by bisection (no
gradient); its gradient comes from the implicit function theorem: one Newton step
eta = eta* - (g(eta*) - eps) / sg(g'(eta*)), g(eta) = KL(pi~_eta || pi_old), has value eta* and gradient
-(dg/dpi) / g'(eta*). The loss is the unclipped surrogate on the projected policy plus a projection loss
that pulls pi towards sg(pi~) (so that pi itself does not leave the region the surrogate sees):

    L_t = -A_t pi~(a_t) / pi_old(a_t) + alpha KL(pi || sg(pi~))     (on S)

The support and pi_old's log-probs on it come from pi_old's no-grad pass (``old_topk_index``,
``old_topk_logp``: the need ``old_topk``, ``OLD_TOPK_SLOTS`` tokens per position recorded by
``old_support``); the current policy's rows are ``logp_vocab``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Settings

OLD_TOPK_SLOTS = 32  # tokens per position recorded by pi_old's pass (the loss uses the first ``top_k``)
PAD_LOGP = -1e4  # the log-prob of a slot no token fills (a vocabulary smaller than the slots): out of the support
ETA_RANGE = (1e-7, 1e2)  # the bracket of the multiplier's search (the authors' ``opt_config``)
BISECTION_STEPS = 50


@torch.no_grad()
def old_support(dist: Tensor, taken: Tensor, k: int = OLD_TOPK_SLOTS) -> tuple[Tensor, Tensor]:
    """(index [..., k] long, log-probs [..., k]) of pi_old's support at each position: the taken token
    (``taken`` [...], the token at that position) in slot 0, then pi_old's most probable other tokens in
    order (``dist`` [..., V]: log pi_old(. | y_<t)). k is capped at V."""
    k = min(k, dist.shape[-1])
    val, idx = dist.topk(k, dim=-1)
    is_taken = idx == taken[..., None]
    in_top = is_taken.any(-1)
    last_idx = torch.where(in_top, idx[..., -1], taken)
    last_val = torch.where(in_top, val[..., -1], dist.gather(-1, taken[..., None]).squeeze(-1))
    idx = torch.cat([idx[..., :-1], last_idx[..., None]], -1)
    val = torch.cat([val[..., :-1], last_val[..., None]], -1)
    slots = torch.arange(k, device=dist.device)
    order = torch.argsort(slots + k * (idx != taken[..., None]).long(), dim=-1)  # the taken token first
    return idx.gather(-1, order), val.gather(-1, order)


def _geometric(a: Tensor, b: Tensor, eta: Tensor) -> Tensor:
    """log pi~_eta = log-softmax((a + eta b) / (1 + eta)) over the last dim (a, b: normalised log-probs)."""
    return torch.log_softmax((a + eta[..., None] * b) / (1.0 + eta[..., None]), dim=-1)


def _kl(p_log: Tensor, q_log: Tensor) -> Tensor:
    """KL(p || q) over the last dim from log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


@torch.no_grad()
def solve_eta(a: Tensor, b: Tensor, eps: float) -> Tensor:
    """The multiplier eta* >= 0 with KL(pi~_eta || pi_old) = eps where KL(pi || pi_old) > eps (0 elsewhere):
    bisection on log eta over ``ETA_RANGE`` (g is decreasing in eta); the bracket's top where even it misses."""
    lo = torch.full(a.shape[:-1], math.log(ETA_RANGE[0]), dtype=a.dtype, device=a.device)
    hi = torch.full_like(lo, math.log(ETA_RANGE[1]))
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        above = _kl(_geometric(a, b, mid.exp()), b) > eps
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    active = _kl(a, b) > eps
    return torch.where(active, hi.exp(), torch.zeros_like(hi))


def project(a: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(log pi~ [..., K], eta* [...]): the KL projection of pi (log-probs ``a``, with gradient) onto the ball
    KL(. || pi_old) <= eps around pi_old (``b``), both normalised over the last dim. The gradient through eta
    is the implicit function theorem's (one Newton step at the root, the derivative held fixed)."""
    eta_star = solve_eta(a.detach(), b, eps)
    with torch.no_grad():
        log_q = _geometric(a.detach(), b, eta_star)
        u = ((b - a.detach()) - ((b - a.detach()) * log_q.exp()).sum(-1, keepdim=True)) / (1 + eta_star[..., None]) ** 2
        slope = (log_q.exp() * u * (log_q - b)).sum(-1).clamp(max=-1e-12)  # g'(eta*) < 0
    residual = _kl(_geometric(a, b, eta_star), b) - eps
    eta = torch.where(eta_star > 0, (eta_star - residual / slope).clamp(min=0.0), torch.zeros_like(eta_star))
    return _geometric(a, b, eta), eta_star


class TROLLSettings(Settings):
    """TROLL's trust region (its KL bound), the weight of the projection loss and the sparse support's size."""

    kl_bound: float = Field(0.05, gt=0, description="eps: the per-token bound KL(pi~ || pi_old) <= eps (the "
                            "authors' 0.05)")
    alpha: float = Field(1.0, ge=0, description="weight of the projection loss KL(pi || sg(pi~))")
    top_k: int = Field(16, ge=2, le=OLD_TOPK_SLOTS, description="tokens of the sparse support: the taken one and "
                       "pi_old's most probable others")


@POLICY_LOSSES.register(
    "troll",
    formula=("L_t = -A_t pi~(a_t)/pi_old(a_t) + alpha KL(pi || sg(pi~)), pi~ = argmin_q KL(q || pi) s.t. "
             "KL(q || pi_old) <= eps = pi^(1/(1+eta)) pi_old^(eta/(1+eta)) / Z (eta = 0 inside the bound), all on "
             "S = the taken token and pi_old's top_k - 1 most probable others, renormalised over S"),
    paper="Becker, Freymuth et al. 2025, TROLL: Trust Regions improve Reinforcement Learning for Large Language "
          "Models (arXiv:2510.03817)",
    settings=TROLLSettings,
    needs=("old_topk",),
)
def troll_loss(logp_vocab: Tensor, old_topk_logp: Tensor, old_topk_index: Tensor, advantages: Tensor,
               mask: Tensor, cfg: TROLLSettings) -> tuple[Tensor, dict[str, Any]]:
    """TROLL's projected surrogate. ``old_topk_index`` / ``old_topk_logp`` [N, T, OLD_TOPK_SLOTS]: pi_old's
    support (taken token in slot 0) and log-probs, ``PAD_LOGP`` in a slot no token fills (then out of the
    support for both policies); ``logp_vocab`` [N, T, V]: the current policy's rows.
    Metrics: ``troll/kl_old`` (KL(pi || pi_old) on S before the projection), ``troll/projected_frac``
    (tokens outside the bound, whose distribution the projection moved), ``ratio`` (pi~(a_t) / pi_old(a_t))."""
    idx, old = old_topk_index[..., : cfg.top_k], old_topk_logp[..., : cfg.top_k]
    current = torch.where(old <= PAD_LOGP / 2, torch.full_like(old, PAD_LOGP), logp_vocab.gather(-1, idx))
    a = torch.log_softmax(current, dim=-1)  # off the mask: rows of zeros, uniform, eta = 0
    b = torch.log_softmax(old.to(a.dtype), dim=-1)
    log_proj, eta = project(a, b, cfg.kl_bound)
    ratio = torch.exp(log_proj[..., 0] - b[..., 0])
    loss = (-advantages * ratio + cfg.alpha * _kl(a, log_proj.detach())) * mask
    with torch.no_grad():
        metrics = {"troll/kl_old": _kl(a, b) * mask, "troll/projected_frac": (eta > 0).to(mask.dtype) * mask,
                   "ratio": ratio.detach()}
    return loss, metrics
