"""InSight: prompts chosen by a weighted mutual-information score over Beta posteriors of their success.

Zhou et al. 2026, "Efficient RLVR Training via Weighted Mutual Information Data Selection"
(arXiv:2603.01907), as its Sections 3 and 5 and Appendix D.2 give it (docs/strategies.md says what was
checked):

* each prompt x has a latent success rate p_x with a Beta(a_x, b_x) belief (prior Beta(a0, b0), (1, 1));
  a group of k samples with s successes updates it to a <- lam * a + (1 - lam) * a0 + s,
  b <- lam * b + (1 - lam) * b0 + (k - s) (the paper's Eq. 6, "temporal discounting"; its runs use
  lam = 1, the plain conjugate update);
* the evidence term (Eq. 13) is the mutual information between p_x and the number of successes of the
  next group of k rollouts, I_k = H(p) - E_s H(p | s); it is computed here by the symmetry of mutual
  information as H[BetaBin(k, a, b)] - E_{p ~ Beta(a, b)} H[Bin(k, p)] (nats), large for prompts with
  little evidence and shrinking as a + b grows;
* the difficulty term (Eq. 15) weighs it at the posterior *mean* mu = a / (a + b):
  w(mu) = mu (1 - mu) exp(-eta (mu - target)^2), a variance filter times a bias towards the success
  rate ``target`` (the paper's mu*, 0.3 in its runs) with sharpness eta (3.0);
* score(x) = w(mu_x) * I_k(a_x, b_x) (Eq. 16); each batch is the n best-scoring prompts (Eq. 17) of a
  candidate pool of ceil(pool * n) prompts drawn uniformly without replacement (16 n in the paper; the
  whole split when smaller).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from reinforge.data.curriculum import StatsSampler
from reinforge.data.prompt_stats import GroupOutcome
from reinforge.data.samplers import TASK_SAMPLERS
from reinforge.registry import Settings
from reinforge.types import Task


class InsightSettings(Settings):
    prior_alpha: float = Field(1.0, gt=0, description="a0 of the Beta prior over a prompt's success rate")
    prior_beta: float = Field(1.0, gt=0, description="b0 of the Beta prior")
    decay: float = Field(1.0, ge=0, le=1, description="lam: old evidence is kept with weight lam per observed "
                         "group (1, the paper's: never forgotten)")
    target: float = Field(0.3, gt=0, lt=1, description="the paper's mu*: the success rate the difficulty bias "
                          "exp(-eta (mu - mu*)^2) favours")
    sharpness: float = Field(3.0, gt=0, description="the paper's eta: how sharply the difficulty bias falls away "
                             "from the target")
    rollouts: int | None = Field(None, ge=1, description="k, the rollouts per prompt the information is about "
                                 "(default: the group size last observed, 1 before any)")
    pool: float = Field(16.0, ge=1, description="candidates per batch slot, drawn uniformly before scoring (the "
                        "paper's M^ = 16 M)")

    @model_validator(mode="after")
    def _finite(self) -> InsightSettings:
        for name in ("prior_alpha", "prior_beta", "sharpness", "pool"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")
        return self


_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def digamma(x: np.ndarray) -> np.ndarray:
    """psi(x) for x > 0: the recurrence psi(x) = psi(x + 1) - 1/x up to x >= 10, then the asymptotic
    series ln x - 1/(2x) - 1/(12x^2) + 1/(120x^4) - 1/(252x^6) + 1/(240x^8) (error < 1e-13)."""
    x = np.asarray(x, dtype=np.float64).copy()
    shift = np.zeros_like(x)
    for _ in range(10):
        small = x < 10
        shift -= np.where(small, 1 / x, 0.0)
        x = np.where(small, x + 1, x)
    inv2 = 1 / (x * x)
    series = np.log(x) - 0.5 / x - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 / 240)))
    return series + shift


def _betaln(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _lgamma(a) + _lgamma(b) - _lgamma(a + b)


def beta_binomial_information(a: np.ndarray, b: np.ndarray, k: int) -> np.ndarray:
    """I(p; y) in nats for p ~ Beta(a, b), y | p ~ Bin(k, p), per element of ``a``, ``b``.

    H[y] from the Beta-Binomial pmf; E_p H[y | p] = -sum_y P(y) [ln C(k, y) + y (psi(a + y) - psi(a + b + k))
    + (k - y) (psi(b + k - y) - psi(a + b + k))], using E[p^y (1-p)^(k-y) ln p] = B(a+y, b+k-y) / B(a, b)
    * (psi(a + y) - psi(a + b + k)). NumPy, not torch: the sampler must not touch the learner's
    allocator or thread pools (a float32 update can then differ in its last bits between runs)."""
    a, b = np.asarray(a, dtype=np.float64)[:, None], np.asarray(b, dtype=np.float64)[:, None]
    y = np.arange(k + 1, dtype=np.float64)
    log_choose = math.lgamma(k + 1) - _lgamma(y + 1) - _lgamma(k - y + 1)
    log_pmf = log_choose + _betaln(a + y, b + k - y) - _betaln(a, b)
    pmf = np.exp(log_pmf)
    entropy = -(pmf * log_pmf).sum(-1)
    psi_n = digamma(a + b + k)
    expected_log_lik = log_choose + y * (digamma(a + y) - psi_n) + (k - y) * (digamma(b + k - y) - psi_n)
    return entropy + (pmf * expected_log_lik).sum(-1)


def insight_scores(a: np.ndarray, b: np.ndarray, k: int, target: float, sharpness: float) -> np.ndarray:
    """w(mu) * I_k(a, b) with w(mu) = mu (1 - mu) exp(-sharpness (mu - target)^2), mu = a / (a + b)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    mu = a / (a + b)
    return mu * (1 - mu) * np.exp(-sharpness * (mu - target) ** 2) * beta_binomial_information(a, b, k)


@TASK_SAMPLERS.register(
    "insight",
    formula="score(x) = mu_x (1 - mu_x) exp(-eta (mu_x - target)^2) * I(p_x; y_{1:k}), p_x ~ Beta(a_x, b_x), "
            "mu_x = a_x / (a_x + b_x); top-n of a uniform candidate pool",
    paper="2603.01907", settings=InsightSettings)
class InsightSampler(StatsSampler):
    """InSight's weighted mutual-information selection (module docstring)."""

    def __init__(self, tasks: Sequence[Task], seed: int, cfg: InsightSettings | None = None) -> None:
        super().__init__(tasks, seed, cfg or InsightSettings())
        self.posteriors: dict[str, tuple[float, float]] = {}
        self.last: dict[str, float] = {}

    def posterior(self, task_id: str) -> tuple[float, float]:
        return self.posteriors.get(task_id, (self.cfg.prior_alpha, self.cfg.prior_beta))

    def rollouts(self) -> int:
        return self.cfg.rollouts or self.stats.last_group_size or 1

    def next_batch(self, n: int) -> list[Task]:
        self.draws += 1
        size = min(len(self.tasks), math.ceil(self.cfg.pool * n))
        rng = np.random.default_rng([self.seed, 11, self.draws])
        pool = rng.choice(len(self.tasks), size=size, replace=False)
        candidates = [self.tasks[int(i)] for i in pool]
        ab = np.array([self.posterior(t.id) for t in candidates], dtype=np.float64)
        scores = insight_scores(ab[:, 0], ab[:, 1], self.rollouts(), self.cfg.target, self.cfg.sharpness)
        best = np.argsort(-scores, kind="stable")[:n].tolist()  # ties: the pool's (random) order
        out = [candidates[i] for i in best]
        while len(out) < n:  # a split smaller than the batch: the ranking again, as the uniform sampler repeats
            out += [candidates[i] for i in best][: n - len(out)]
        chosen = ab[best]
        self.last = {"sampler/score_mean": float(scores[best].mean()),
                     "sampler/posterior_mean": float((chosen[:, 0] / chosen.sum(-1)).mean())}
        return out

    def learn(self, groups: list[GroupOutcome]) -> None:
        cfg, lam = self.cfg, self.cfg.decay
        for g in groups:
            a, b = self.posterior(g.task_id)
            s = sum(g.correct)
            self.posteriors[g.task_id] = (lam * a + (1 - lam) * cfg.prior_alpha + s,
                                          lam * b + (1 - lam) * cfg.prior_beta + len(g.correct) - s)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), **self.last}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "posteriors": {k: list(v) for k, v in self.posteriors.items()},
                "last": dict(self.last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.posteriors = {k: (float(v[0]), float(v[1])) for k, v in state["posteriors"].items()}
        self.last = {k: float(v) for k, v in state["last"].items()}
