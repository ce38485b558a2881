"""The KL penalty to a reference policy: its estimators, per token, and its coefficient's controller.

With samples from the current policy pi and log r = log pi_ref(x) - log pi(x) (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html):

- k1 = -log r                  (unbiased, high variance, can be negative)
- k2 = (log r)^2 / 2           (biased, low variance)
- k3 = (r - 1) - log r         (unbiased, low variance, always >= 0)
- k3_st = k3 in value, k2's gradient (straight-through: sg(k3) + k2 - sg(k2))

and of the forward KL(pi_ref || pi), from the same samples of pi, with the importance weight
rho = pi_ref(x) / pi(x) = r (``k1_fwd``, ``k3_fwd``: the derivation is in ``kl_k3_fwd``'s docstring).

Signature (registered in ``KL_ESTIMATORS``): ``fn(logp: Tensor[N,T], ref_logp: Tensor[N,T]) -> Tensor[N,T]``.

The coefficient beta of the penalty is fixed or adapted towards a target KL (``KLController``,
Ziegler et al. 2019).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _straight_through(value: Tensor, grad_coef: Tensor, logp: Tensor) -> Tensor:
    """``value`` forward, ``grad_coef * grad log pi`` backward: sg(value) + sg(c) * (log pi - sg(log pi))."""
    return value.detach() + grad_coef.detach() * (logp - logp.detach())


@KL_ESTIMATORS.register(
    "k1_fwd",
    formula="k1_fwd = rho log rho, rho = pi_ref / pi; gradient -rho grad log pi",
    paper="forward KL(pi_ref || pi) from samples of pi by importance weighting; cf. " + _SCHULMAN,
)
def kl_k1_fwd(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Forward KL(pi_ref || pi) per token, plain importance-weighted estimator: value rho log rho,
    gradient -rho grad log pi (both unbiased on samples of pi; see ``kl_k3_fwd``). rho can be large
    where pi is small and pi_ref is not, and the value can be negative: ``k3_fwd`` is the low-variance one."""
    log_rho = torch.clamp(ref_logp - logp, -20.0, 20.0)
    rho = torch.exp(log_rho)
    return _straight_through(rho * log_rho, -rho, logp)


@KL_ESTIMATORS.register(
    "k3_fwd",
    formula="k3_fwd = rho log rho - (rho - 1), rho = pi_ref / pi; gradient (1 - rho) grad log pi",
    paper="forward KL(pi_ref || pi) from samples of pi, the k3 control variate applied to it; "
          "the forward-KL penalty of RAPO, Deng et al. 2025 (arXiv:2510.03865); cf. " + _SCHULMAN,
)
def kl_k3_fwd(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Forward KL(pi_ref || pi) per token, from samples x ~ pi (the rollout's tokens).

    With the importance weight rho = pi_ref(x) / pi(x):

        KL(pi_ref || pi) = sum_x pi_ref(x) log(pi_ref(x) / pi(x)) = E_{x~pi}[rho log rho]

    so k1_fwd = rho log rho is unbiased. E_{x~pi}[rho - 1] = sum_x pi_ref(x) - 1 = 0, so subtracting
    it keeps the estimate unbiased: k3_fwd = rho log rho - (rho - 1), which is >= 0 for every sample
    (x log x - x + 1 is convex with its minimum 0 at x = 1) and, near pi = pi_ref, each sample is
    about (log rho)^2 / 2 where k1_fwd's is about log rho: a second-order spread instead of a first. It is k3 with the roles of pi and pi_ref swapped inside the
    weight (k3 = r - 1 - log r weighs log r by 1, k3_fwd by rho).

    Gradient: grad KL(pi_ref || pi) = -sum_x pi_ref(x) grad log pi(x) = -E_{x~pi}[rho grad log pi(x)]
    = E_{x~pi}[(1 - rho) grad log pi(x)] (E_pi[grad log pi] = 0: 1 is a baseline). Autograd of the
    sample value would give only the pathwise part, d k3_fwd / d log pi = -rho log rho, which misses
    the score-function term of the sampling distribution, so the returned tensor is straight-through:
    value k3_fwd, gradient (1 - rho) grad log pi. In the loss this is exactly the gradient of ``k3``
    (d k3 / d log pi = 1 - r): ``k3`` in the loss already follows the forward KL's gradient, only the
    value differs (it matters with ``placement: reward`` and in the ``kl_ref`` metric).

    Per token: x is y_t given the sampled prefix, so the sum over a sequence estimates the forward KL
    of each next-token distribution along pi's prefixes (the sequence-level forward KL would weigh the
    prefixes by pi_ref instead: a product of ratios over the sequence, not used). On samples of an
    older policy (several updates per batch) the estimate is not reweighted by pi / pi_old, as for
    k1-k3. log rho is clamped to [-20, 20].
    """
    log_rho = torch.clamp(ref_logp - logp, -20.0, 20.0)
    rho = torch.exp(log_rho)
    return _straight_through(rho * log_rho - (rho - 1.0), 1.0 - rho, logp)


class KLController:
    """The coefficient beta of the KL penalty, fixed or adapted towards a target KL.

    ``target == 0``: fixed, ``value`` stays ``init_coef``. Otherwise the adaptive rule of Ziegler et
    al. 2019, "Fine-Tuning Language Models from Human Preferences" (arXiv:1909.08593), sec. 2.2:
    e_t = clip(KL_t / target - 1, -0.2, 0.2);  beta_{t+1} = beta_t * (1 + K_beta e_t), with
    K_beta = n_steps / horizon (n_steps: samples or steps the observed KL covers, ``horizon`` in the
    same unit). A KL above target raises beta, below target lowers it, by at most 20% per horizon.
    """

    def __init__(self, init_coef: float, target: float = 0.0, horizon: int = 10000) -> None:
        if init_coef < 0:
            raise ValueError(f"KL coefficient must be >= 0, got {init_coef}")
        if target < 0:
            raise ValueError(f"KL target must be >= 0, got {target}")
        if target > 0 and horizon <= 0:
            raise ValueError(f"KL controller horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    @property
    def adaptive(self) -> bool:
        return self.target > 0

    def update(self, observed_kl: float, n_steps: int) -> None:
        """beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon); no-op if fixed."""
        if not self.adaptive:
            return
        error = min(max(float(observed_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
