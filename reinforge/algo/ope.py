"""Off-policy evaluation estimators (pure tensor math) over logged episodes, padded to [N, T]:
``rewards``, ``behavior_logp`` = log mu(a_t | s_t) (the logging policy), ``target_logp`` =
log pi(a_t | s_t) (the policy evaluated), ``mask`` (1 on real steps). The per-decision weight is
rho_{0:t} = prod_{u <= t} pi(a_u|s_u) / mu(a_u|s_u) (Precup et al. 2000, "Eligibility Traces for
Off-Policy Policy Evaluation"); every estimator returns the per-episode terms [N] whose mean (or,
weighted, the ratio of sums) estimates V(pi) = E_pi[sum_t gamma^t r_t], so intervals come from a
bootstrap over episodes (``ope_estimate``).

- ``is``:   G_i * rho_{0:T-1}                                        (trajectory-wise importance sampling)
- ``wis``:  sum_i rho_i G_i / sum_i rho_i                            (weighted: biased, far lower variance)
- ``pdis``: sum_t gamma^t rho_{0:t} r_t                              (per-decision IS)
- ``dr``:   sum_t gamma^t [rho_{0:t} (r_t - Q(s_t, a_t)) + rho_{0:t-1} V(s_t)]   (doubly robust,
  Jiang & Li 2016, arXiv:1511.03722; Thomas & Brunskill 2016), with Q, V = E_{a~pi} Q a model's
  estimates (FQE's, classic/fqe.py): unbiased if the weights are right, low-variance if Q is.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _discounts(shape: torch.Size, gamma: float, dtype: torch.dtype) -> Tensor:
    return gamma ** torch.arange(shape[-1], dtype=dtype).expand(shape)


def cumulative_ratios(behavior_logp: Tensor, target_logp: Tensor, mask: Tensor) -> Tensor:
    """rho_{0:t} [N, T] (1 past an episode's end: padding does not change the product)."""
    log_ratio = ((target_logp - behavior_logp) * mask).double()
    return torch.cumsum(log_ratio, -1).exp()


def per_episode_terms(estimator: str, rewards: Tensor, behavior_logp: Tensor, target_logp: Tensor, mask: Tensor,
                      gamma: float, q_taken: Tensor | None = None, v_pi: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(numerators [N], denominators [N]) of ``estimator``: V = sum(num) / sum(den) (den = 1 except wis)."""
    mask = mask.double()
    disc = _discounts(rewards.shape, gamma, torch.float64) * mask
    rho = cumulative_ratios(behavior_logp, target_logp, mask)
    r = rewards.double() * mask
    ones = torch.ones(rewards.shape[0], dtype=torch.float64)
    if estimator in ("is", "wis"):
        weight = rho[:, -1]
        ret = (disc * r).sum(-1)
        return weight * ret, (weight if estimator == "wis" else ones)
    if estimator == "pdis":
        return (disc * rho * r).sum(-1), ones
    if estimator == "dr":
        if q_taken is None or v_pi is None:
            raise ValueError("dr needs q_taken (Q(s_t, a_t)) and v_pi (E_{a~pi} Q(s_t, a)) [N, T]")
        rho_prev = torch.cat([torch.ones_like(rho[:, :1]), rho[:, :-1]], -1)
        terms = rho * (r - q_taken.double() * mask) + rho_prev * v_pi.double() * mask
        return (disc * terms).sum(-1), ones
    raise ValueError(f"unknown estimator {estimator!r}: is, wis, pdis, dr")


def ope_value(num: Tensor, den: Tensor) -> float:
    return float(num.sum() / den.sum())


def ope_estimate(num: Tensor, den: Tensor, samples: int = 2000, seed: int = 0) -> dict[str, float]:
    """The estimate and a 95% percentile-bootstrap interval over episodes (resampled with replacement)."""
    g = torch.Generator().manual_seed(seed)
    n = num.shape[0]
    idx = torch.randint(n, (samples, n), generator=g)
    boot = num[idx].sum(-1) / den[idx].sum(-1)
    lo, hi = torch.quantile(boot, torch.tensor([0.025, 0.975], dtype=boot.dtype)).tolist()
    return {"value": ope_value(num, den), "ci_low": lo, "ci_high": hi}


def sharpe_ratio_at_k(estimated: Tensor, true: Tensor, behavior_value: float, k: int) -> dict[str, float]:
    """SharpeRatio@k of an estimator over P candidate policies (Kiyohara et al. 2023, "Towards Assessing and
    Benchmarking Risk-Return Tradeoff of Off-Policy Evaluation", arXiv:2311.18207): the k policies the
    estimator ranks highest (``estimated`` [P], ties broken by the order given) form its portfolio Pi_k, and

        SharpeRatio@k = (best@k - J(pi_b)) / std@k,  best@k = max_{pi in Pi_k} J(pi),
        std@k = sqrt(1/k sum_{pi in Pi_k} (J(pi) - mean_{Pi_k} J)^2)

    with J the true values (``true`` [P]) and J(pi_b) the behaviour policy's (the risk-free baseline; the
    paper counts pi_b among the candidates, which the caller does by listing it). k >= 2: one policy has no
    spread. Returns ``best``, ``std``, ``sharpe`` (inf when the k true values are equal and best beats pi_b)."""
    if not 2 <= k <= estimated.shape[0]:
        raise ValueError(f"k must be in [2, {estimated.shape[0]}] (the candidates), got {k}")
    top = torch.argsort(estimated, descending=True, stable=True)[:k]
    values = true[top].double()
    best, std = float(values.max()), float(values.std(unbiased=False))
    excess = best - behavior_value
    sharpe = excess / std if std > 0 else (float("inf") if excess > 0 else 0.0)
    return {"best": best, "std": std, "sharpe": sharpe}
