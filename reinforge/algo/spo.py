"""SPO: single-stream policy optimisation with a persistent per-prompt value tracker (Xu & Ding 2025,
arXiv:2509.13232).

No groups: the baseline of prompt x is a tracked success rate v(x) = alpha(x) / (alpha(x) + beta(x))
(a Beta posterior over Bernoulli rewards), read *before* this step's rewards are added, and the
advantages are normalised over the whole batch:

    A_i = r_i - v(x_i);   A_i <- (A_i - mean_B(A)) / (std_B(A) + eps)
    then, per prompt x of the batch with rewards r_1..r_k:  alpha <- rho alpha + sum r,  beta <- rho beta + sum (1 - r)

rho is the forgetting factor: ``constant`` (``rho``), or ``kl``: rho = clip(2^(-D / d_half), rho_min, rho_max)
with D the policy's drift since the prompt's last visit. The tracker lives in the learner (the
estimator's controller, algo/objective.py ``advantage_controller``) and is saved in checkpoints.
Group size 1 is the intended setting; with more samples per prompt every sample reads the same v(x).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, NormSettings
from reinforge.algo.returns import _batch_mean_std, _per_token


class ValueTracker:
    """Per-prompt Beta(alpha, beta) success-rate trackers, keyed by ``prompt_key``, and the policy's drift.

    ``values(keys)`` reads v(x) (the prior for a prompt never seen); ``observe(keys, rewards)`` adds a
    step's rewards with the forgetting factor; ``update(metrics)`` (after every update) adds the
    update's drift (``metrics[drift_metric]``) to the cumulative drift the ``kl`` mode reads."""

    def __init__(self, settings: SPOSettings) -> None:
        self.settings = settings
        self.alpha: dict[int, float] = {}
        self.beta: dict[int, float] = {}
        self.seen_at: dict[int, float] = {}  # cumulative drift at each prompt's last visit
        self.drift = 0.0
        self.last: dict[str, float] = {}

    def values(self, keys: list[int]) -> list[float]:
        s = self.settings
        return [self.alpha[k] / (self.alpha[k] + self.beta[k]) if k in self.alpha else s.prior_value for k in keys]

    def rho(self, key: int) -> float:
        s = self.settings
        if s.rho_mode == "constant":
            return s.rho
        d = self.drift - self.seen_at.get(key, self.drift)
        return min(max(2.0 ** (-d / s.d_half), s.rho_min), s.rho_max)

    def observe(self, keys: list[int], rewards: list[float]) -> None:
        """Each prompt's rewards of this step: alpha <- rho alpha + sum r, beta <- rho beta + sum (1 - r)."""
        s = self.settings
        sums: dict[int, list[float]] = {}
        for k, r in zip(keys, rewards, strict=True):
            sums.setdefault(k, []).append(r)
        rhos = []
        for k, rs in sums.items():
            a = self.alpha.get(k, s.prior_count * s.prior_value)
            b = self.beta.get(k, s.prior_count * (1.0 - s.prior_value))
            rho = self.rho(k)
            rhos.append(rho)
            self.alpha[k] = rho * a + sum(rs)
            self.beta[k] = rho * b + sum(1.0 - r for r in rs)
            self.seen_at[k] = self.drift
        self.last = {"spo/rho": sum(rhos) / len(rhos) if rhos else 1.0, "spo/prompts_tracked": float(len(self.alpha))}

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        self.drift += float(metrics.get(self.settings.drift_metric, 0.0))
        return {**self.last, "spo/drift": self.drift}

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": {str(k): v for k, v in self.alpha.items()}, "beta": {str(k): v for k, v in self.beta.items()},
                "seen_at": {str(k): v for k, v in self.seen_at.items()}, "drift": self.drift}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.alpha = {int(k): float(v) for k, v in state["alpha"].items()}
        self.beta = {int(k): float(v) for k, v in state["beta"].items()}
        self.seen_at = {int(k): float(v) for k, v in state["seen_at"].items()}
        self.drift = float(state["drift"])


class SPOSettings(NormSettings):
    """SPO: the tracker's prior and forgetting factor, and the batch normalisation."""

    controller: ClassVar[type] = ValueTracker
    prior_value: float = Field(0.5, description="v(x) of a prompt never seen (the Beta prior's mean)")
    prior_count: float = Field(1.0, gt=0, description="weight of the prior, alpha0 + beta0 (the reference code: 1)")
    rho_mode: Literal["constant", "kl"] = Field(
        "constant", description="constant: rho every visit; kl: 2^(-D / d_half) clipped to [rho_min, rho_max], D the "
        "drift since the prompt's last visit (sum of drift_metric over the updates since)")
    rho: float = Field(0.875, gt=0, le=1, description="forgetting factor of rho_mode constant")
    d_half: float = Field(0.06, gt=0, description="drift at which rho halves (rho_mode kl; the paper: 0.06)")
    rho_min: float = Field(0.875, gt=0, le=1, description="lower clip of rho (rho_mode kl)")
    rho_max: float = Field(0.96, gt=0, le=1, description="upper clip of rho (rho_mode kl)")
    drift_metric: str = Field("approx_kl_old", description="the update metric summed as the policy's drift (kl)")
    normalize: bool = Field(True, description="normalise the advantages over the batch (mean 0, std 1)")

    @model_validator(mode="after")
    def _clip(self) -> SPOSettings:
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min ({self.rho_min}) must not exceed rho_max ({self.rho_max})")
        return self


@ADVANTAGES.register(
    "spo",
    formula="A_i = r_i - v(x_i), v = alpha / (alpha + beta) tracked per prompt across steps; "
            "A_i <- (A_i - mean_B(A)) / (std_B(A) + eps); alpha <- rho alpha + r, beta <- rho beta + (1 - r)",
    paper="Xu & Ding 2025, Single-stream Policy Optimization (SPO, arXiv:2509.13232)",
    needs=("prompt_key", "ungrouped"),
    settings=SPOSettings,
)
def spo_advantage(rewards: Tensor, mask: Tensor, prompt_key: Tensor | None, cfg: Any,
                  token_rewards: Tensor | None = None) -> Tensor:
    """SPO's advantage: the reward minus the prompt's tracked value (before this step's rewards),
    normalised over the batch (population std); then the tracker takes in this step's rewards.

    ``cfg`` is the run's ``ValueTracker`` (``ValueError`` with anything else: the baseline needs the
    tracker's state). Every token of sequence i gets A_i; with ``token_rewards`` also their
    returns-to-go.
    """
    if not isinstance(cfg, ValueTracker) or prompt_key is None:
        raise ValueError("advantage 'spo' needs its ValueTracker as cfg and prompt_key= (one key per sequence)")
    keys = [int(k) for k in prompt_key.tolist()]
    r = rewards.to(torch.float64)
    adv = r - torch.tensor(cfg.values(keys), dtype=torch.float64)
    cfg.observe(keys, r.tolist())
    if cfg.settings.normalize:
        mu, sigma = _batch_mean_std(adv)
        adv = (adv - mu) / (sigma + cfg.settings.adv_eps)
    return _per_token(adv, mask, token_rewards, cfg.settings)
