"""DCPO's Smooth Advantage Standardization (SAS): each prompt's rewards standardised both against this
step's group and against the prompt's reward statistics accumulated over every step it was drawn in
(Yang et al. 2025, DCPO, arXiv:2509.02333, section 3.2; the formulas as the authors' code computes them,
lime-RL/DCPO ``compute_dcpo_outcome_advantage`` and ``get_mean_std`` in verl/trainer/ppo/core_algos.py).

For a prompt drawn for the (k+1)-th time, with this step's group rewards r_1..r_G (mean mu_n, unbiased std
sigma_n) and its statistics after k earlier steps (mu_o, sigma_o):

    mu_c = (k mu_o + mu_n) / (k + 1)
    sigma_c^2 = (k sigma_o^2 + sigma_n^2 + k / (k + 1) (mu_n - mu_o)^2) / (k + 1)      (mu_c = mu_n, sigma_c = sigma_n at k = 0)
    z_n = (r - mu_n) / sigma_n,  z_c = (r - mu_c) / sigma_c                            (0 where the std is 0)
    SAS_a = 1/(k+1) z_c + k/(k+1) z_n,  SAS_b = 1/(k+1) z_n + k/(k+1) z_c
    A = SAS_a if |SAS_a| < |SAS_b| else SAS_b

The first visit is GRPO's advantage; a later group of equal rewards (z_n = 0) gets z_c / (k + 1) where
the prompt's history has spread, so it still trains. The state (``RewardHistory``) lives in the learner
as the estimator's controller and is saved in checkpoints. ``history_scale`` multiplies mu_o and sigma_o
before they are combined (the code's ``user_old_mean_ratio``, 1 in the paper's runs).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, DiscountSettings, group_mean_std
from reinforge.algo.returns import _per_token


class RewardHistory:
    """Per-prompt reward mean, std and the number of steps they were accumulated over, keyed by ``prompt_key``."""

    def __init__(self, settings: SASSettings) -> None:
        self.settings = settings
        self.mean: dict[int, float] = {}
        self.std: dict[int, float] = {}
        self.times: dict[int, int] = {}
        self.last: dict[str, float] = {}

    def accumulate(self, key: int, new_mean: float, new_std: float) -> tuple[float, float, int]:
        """Fold one step's group statistics into ``key``'s; returns (mu_c, sigma_c, k) with k the earlier steps."""
        k = self.times.get(key, 0)
        if k == 0:
            mean, std = new_mean, new_std
        else:
            old_mean = self.mean[key] * self.settings.history_scale
            old_std = self.std[key] * self.settings.history_scale
            mean = (k * old_mean + new_mean) / (k + 1)
            var = (k * old_std**2 + new_std**2 + k / (k + 1) * (new_mean - old_mean) ** 2) / (k + 1)
            std = var**0.5
        self.mean[key], self.std[key], self.times[key] = mean, std, k + 1
        return mean, std, k

    def update(self, metrics: dict[str, float]) -> dict[str, float]:
        return dict(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"mean": {str(k): v for k, v in self.mean.items()}, "std": {str(k): v for k, v in self.std.items()},
                "times": {str(k): v for k, v in self.times.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = {int(k): float(v) for k, v in state["mean"].items()}
        self.std = {int(k): float(v) for k, v in state["std"].items()}
        self.times = {int(k): int(v) for k, v in state["times"].items()}


class SASSettings(DiscountSettings):
    """SAS: the weight of the accumulated statistics."""

    controller: ClassVar[type] = RewardHistory
    history_scale: float = Field(1.0, gt=0, description="multiplies a prompt's accumulated mean and std before this "
                                 "step's are folded in (the authors' code: user_old_mean_ratio, 1 in the paper)")


def _standardised(r: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    return torch.where(std > 0, (r - mean) / torch.where(std > 0, std, torch.ones_like(std)), torch.zeros_like(r))


@ADVANTAGES.register(
    "dcpo_sas",
    formula="z_n = (r_i - mu_n) / sigma_n (this step's group), z_c = (r_i - mu_c) / sigma_c (the prompt's "
            "statistics over its k + 1 steps); SAS_a = z_c / (k+1) + k z_n / (k+1), SAS_b = z_n / (k+1) + k z_c / (k+1); "
            "A_i = the one of smaller |.|",
    paper="Yang et al. 2025, DCPO Smooth Advantage Standardization (arXiv:2509.02333, section 3.2; authors' code)",
    needs=("prompt_key", "ungrouped"),
    settings=SASSettings,
)
def dcpo_sas_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, prompt_key: Tensor | None, cfg: Any,
                       token_rewards: Tensor | None = None) -> Tensor:
    """DCPO's SAS advantage of every sequence, broadcast to its tokens (with ``token_rewards`` also their
    returns-to-go). ``cfg`` is the run's ``RewardHistory``; each group is one visit of its prompt, folded
    into the history in group order before its samples are standardised against it."""
    if not isinstance(cfg, RewardHistory) or prompt_key is None:
        raise ValueError("advantage 'dcpo_sas' needs its RewardHistory as cfg and prompt_key= (one key per sequence)")
    r = rewards.to(torch.float64)
    new_mean, new_std, _ = group_mean_std(r, group_index)
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    first = torch.full((n_groups,), -1, dtype=torch.long).scatter_reduce(
        0, group_index, torch.arange(len(r)), "amax", include_self=True)  # one row of each group
    cum_mean, cum_std, weight = (torch.zeros(n_groups, dtype=torch.float64) for _ in range(3))
    for g, row in enumerate(first.tolist()):
        if row < 0:
            continue
        mu, sigma, k = cfg.accumulate(int(prompt_key[row]), float(new_mean[row]), float(new_std[row]))
        cum_mean[g], cum_std[g], weight[g] = mu, sigma, 1.0 / (k + 1)
    z_new = _standardised(r, new_mean, new_std)
    z_cum = _standardised(r, cum_mean[group_index], cum_std[group_index])
    w = weight[group_index]
    sas_a, sas_b = w * z_cum + (1 - w) * z_new, w * z_new + (1 - w) * z_cum
    adv = torch.where(sas_a.abs() < sas_b.abs(), sas_a, sas_b)
    revisited = (w < 1).to(torch.float64)
    cfg.last = {"sas/revisited_frac": float(revisited.mean()) if len(r) else 0.0,
                "sas/prompts_tracked": float(len(cfg.times))}
    return _per_token(adv, mask, token_rewards, cfg.settings)
