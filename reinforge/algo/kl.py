"""KL estimators between the current policy and a reference policy, per token.

With samples from the current policy pi and log r = log pi_ref(x) - log pi(x) (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html):

- k1 = -log r                  (unbiased, high variance, can be negative)
- k2 = (log r)^2 / 2           (biased, low variance)
- k3 = (r - 1) - log r         (unbiased, low variance, always >= 0)
- k3_st = k3 in value, k2's gradient (straight-through: sg(k3) + k2 - sg(k2))

Signature (registered in ``KL_ESTIMATORS``): ``fn(logp: Tensor[N,T], ref_logp: Tensor[N,T]) -> Tensor[N,T]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from reinforge.registry import Registry, kind

KLFn = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = kind("kl_estimator", Registry("KL estimator"))
_SCHULMAN = "Schulman 2020, Approximating KL Divergence (joschu.net/blog/kl-approx.html)"


@KL_ESTIMATORS.register("k1", formula="k1 = log pi - log pi_ref", paper=_SCHULMAN)
def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log pi(x) - log pi_ref(x)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2", formula="k2 = (log pi - log pi_ref)^2 / 2", paper=_SCHULMAN)
def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = (log pi(x) - log pi_ref(x))^2 / 2."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register(
    "k3", formula="k3 = exp(log pi_ref - log pi) - 1 - (log pi_ref - log pi)", paper=_SCHULMAN + "; used by GRPO"
)
def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = r - 1 - log r with log r = log pi_ref(x) - log pi(x); log r is clamped to [-20, 20] for safety."""
    log_r = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.exp(log_r) - 1.0 - log_r


@KL_ESTIMATORS.register(
    "k3_st",
    formula="k3_st = sg(k3) + k2 - sg(k2): value k3, gradient of k2 (d/dlogp = log pi - log pi_ref)",
    paper=_SCHULMAN + "; straight-through k3 value with the k2 gradient",
)
def kl_k3_st(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Straight-through k3: k3_st = sg(k3) + k2 - sg(k2) (sg = stop-gradient).

    The value is k3 = r - 1 - log r (unbiased, non-negative, reported as the KL), while the gradient
    is that of k2 = (log pi - log pi_ref)^2 / 2, i.e. d k3_st / d log pi = log pi - log pi_ref. On
    samples of pi, E[(log pi - log pi_ref) grad log pi] is the gradient of the reverse KL(pi || pi_ref),
    whereas differentiating the k3 sample value gives E[(1 - pi_ref/pi) grad log pi], the gradient of
    the forward KL(pi_ref || pi).
    """
    k2 = kl_k2(logp, ref_logp)
    return kl_k3(logp, ref_logp).detach() + k2 - k2.detach()
