"""REC, REP and RED: group-relative REINFORCE read as an off-policy algorithm (Yao et al. 2025, "Group-Relative
REINFORCE Is Secretly an Off-Policy Algorithm: Demystifying Some Myths About GRPO and Its Friends",
arXiv:2509.24203; the loss as the authors' code computes it, Trinity-RFT
``trinity/algorithm/policy_loss_fn/rec_policy_loss.py``, its variants as ``examples/rec_gsm8k`` names them).

The gradient of REINFORCE with a group-mean baseline stays a valid off-policy update when the policy is kept
near the behaviour policy by *regularisation*, not by importance weights. One loss, three switches:

    L_t = -w_t A_t log pi(y_t) 1[rho_t in range_t] + reg_t,     rho_t = sg(pi(y_t) / pi_old(y_t))

- ``clip_mode`` (REC, regularisation by clipping): the tokens kept. ``one_side``: rho <= 1 + eps_high where
  A >= 0 and rho >= 1 - eps_low where A <= 0 (PPO's trust region as a mask); ``two_side``: 1 - eps_low <= rho
  <= 1 + eps_high; ``ring``: two_side, or rho <= 1 - eps_low' where A >= 0, or rho >= 1 + eps_high' where A <= 0
  (far-off tokens whose move would pull them back are kept); ``none``: every token.
- ``weight``: ``none`` (w = 1: REC-*-NoIS), ``importance_sampling`` (w = rho, detached: REC-*-IS; with
  one_side that is GRPO's gradient where the clip does not act), ``advantage`` (w = exp(A / temp): RED-Weight).
- ``regularizer`` (REP, regularisation by a loss term): ``k2``, c (log pi - log pi_old)^2 (Kimi's OPMD);
  ``forward_kl``, -c log pi (Meta's AsymRE: the baseline lowered by c).

Token mean over the batch (the code's ``masked_mean``): the presets and recipes pair it with
``loss_agg: token_mean``; the advantage is the group-mean-centred reward without std (``dr_grpo``), as the
variants' ``std_normalize: false``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, NormSettings, group_mean_std
from reinforge.algo.groups import dense_groups, rank_in_group
from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.algo.returns import _per_token
from reinforge.registry import Settings


class RECSettings(Settings):
    """REC's clip mode and ranges, REC/RED's weight, REP's regularizer (defaults: REC-OneSide-NoIS)."""

    clip_mode: Literal["none", "one_side", "two_side", "ring"] = Field("one_side", description="which tokens keep "
                                                                        "their gradient (REC)")
    clip_low: float = Field(0.2, gt=0, le=1, description="eps_low: the range's lower side, 1 - eps_low")
    clip_high: float = Field(0.2, gt=0, description="eps_high: the range's upper side, 1 + eps_high")
    ring_low: float = Field(0.6, gt=0, le=1, description="eps_low' of ring: A >= 0 tokens below 1 - eps_low' are kept")
    ring_high: float = Field(2.0, gt=0, description="eps_high' of ring: A <= 0 tokens above 1 + eps_high' are kept")
    weight: Literal["none", "importance_sampling", "advantage"] = Field("none", description="the weight of A: 1, "
                                                                         "rho (detached), or exp(A / temp) (RED-Weight)")
    temp: float = Field(1.0, gt=0, description="temperature of weight: advantage")
    regularizer: Literal["none", "k2", "forward_kl"] = Field("none", description="REP's loss term: c (log pi - "
                                                             "log pi_old)^2 (OPMD) or -c log pi (AsymRE)")
    regularizer_coef: float = Field(0.0, ge=0, description="c of the regularizer")


def _one_side(rho: Tensor, adv: Tensor, cfg: RECSettings) -> Tensor:
    return ((rho <= 1 + cfg.clip_high) & (adv >= 0)) | ((rho >= 1 - cfg.clip_low) & (adv <= 0))


def _two_side(rho: Tensor, adv: Tensor, cfg: RECSettings) -> Tensor:
    return (rho >= 1 - cfg.clip_low) & (rho <= 1 + cfg.clip_high)


def _ring(rho: Tensor, adv: Tensor, cfg: RECSettings) -> Tensor:
    return (_two_side(rho, adv, cfg) | ((adv >= 0) & (rho <= 1 - cfg.ring_low))
            | ((adv <= 0) & (rho >= 1 + cfg.ring_high)))


IN_RANGE: dict[str, Callable[[Tensor, Tensor, RECSettings], Tensor]] = {
    "none": lambda rho, adv, cfg: torch.ones_like(rho, dtype=torch.bool),
    "one_side": _one_side, "two_side": _two_side, "ring": _ring,
}
WEIGHTED: dict[str, Callable[[Tensor, Tensor, RECSettings], Tensor]] = {
    "none": lambda adv, rho, cfg: adv,
    "importance_sampling": lambda adv, rho, cfg: adv * rho,
    "advantage": lambda adv, rho, cfg: adv * torch.exp(adv / cfg.temp),
}
REGULARIZERS: dict[str, Callable[[Tensor, Tensor, RECSettings], Tensor]] = {
    "none": lambda logp, old, cfg: torch.zeros_like(logp),
    "k2": lambda logp, old, cfg: cfg.regularizer_coef * (logp - old) ** 2,
    "forward_kl": lambda logp, old, cfg: -cfg.regularizer_coef * logp,
}


@POLICY_LOSSES.register(
    "rec",
    formula="L_t = -w_t A_t log pi(y_t) 1[rho_t in range_t] + reg_t, rho_t = sg(pi/pi_old); range: one_side "
            "(rho <= 1+eps_high if A >= 0, rho >= 1-eps_low if A <= 0), two_side, ring or none; w: 1, rho_t or "
            "exp(A_t/temp); reg: 0, c (log pi - log pi_old)^2 or -c log pi",
    paper="Yao et al. 2025, Group-Relative REINFORCE Is Secretly an Off-Policy Algorithm (REC/REP/RED, "
          "arXiv:2509.24203; authors' code)",
    settings=RECSettings,
)
def rec_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, cfg: RECSettings
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE's token loss on the tokens in range, weighted, plus the regularizer. Metrics: ``clip_frac``
    (tokens out of range), ``ratio``."""
    rho = torch.exp(logp - old_logp).detach()
    keep = IN_RANGE[cfg.clip_mode](rho, advantages, cfg)
    weighted = WEIGHTED[cfg.weight](advantages, rho, cfg)
    loss = -weighted * logp * keep.to(logp.dtype) + REGULARIZERS[cfg.regularizer](logp, old_logp, cfg)
    with torch.no_grad():
        metrics = {"clip_frac": (~keep).to(logp.dtype), "ratio": rho}
    return loss, metrics


# ------------------------------------------------------------------------------------------------ RED-Drop


class REDDropSettings(NormSettings):
    """RED-Drop: the advantage of the kept rows, optionally divided by their std."""

    scale_by_std: bool = Field(False, description="divide by the kept rows' population std + eps (the examples' "
                               "std_normalize: false)")


def red_drop_keep(r: Tensor, group_index: Tensor) -> Tensor:
    """Which rows RED-Drop keeps: in a group with more negatives (r < the group's mean) than positives
    (r >= it), the first ``negatives - positives`` negatives in row order are dropped."""
    mean, _, _ = group_mean_std(r, group_index)
    neg = r < mean
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    negatives = torch.bincount(group_index[neg], minlength=n_groups)
    surplus = (2 * negatives - torch.bincount(group_index, minlength=n_groups)).clamp(min=0)  # neg - pos
    keep = torch.ones_like(neg)
    gid, n = dense_groups(group_index[neg])
    rank, _ = rank_in_group(gid, n)  # each negative's place among its group's negatives
    keep[neg] = rank >= surplus[group_index[neg]]
    return keep


@ADVANTAGES.register(
    "red_drop",
    formula="in a group with more negatives (r < mean_g r) than positives, the first (negatives - positives) "
            "negatives get A = 0; A_i = r_i - mean of the kept rows [/ (their population std + eps)]; "
            "a group with one kept row: A = r",
    paper="Yao et al. 2025, RED-Drop (arXiv:2509.24203; authors' code, rec_advantage.py drop: balance)",
    settings=REDDropSettings,
)
def red_drop_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: REDDropSettings,
                       token_rewards: Tensor | None = None) -> Tensor:
    """RED-Drop's balanced advantage (the authors' ``RECGroupedAdvantage`` with ``drop: balance``): surplus
    negatives are dropped (advantage 0) so a group trains on as many below-mean rows as above-mean ones, and
    the baseline is the kept rows' mean. Departure: the code drops a random choice of the surplus; here the
    first ones in row order (the samples of a group are exchangeable, and the estimator stays a pure function
    of the batch, so a resumed run repeats it)."""
    r = rewards.to(torch.float64)
    keep = red_drop_keep(r, group_index)
    mean, std, count = group_mean_std(r[keep], group_index[keep])  # over the kept rows; std unbiased
    several = count > 1
    centred = torch.where(several, r[keep] - mean, r[keep])  # one kept row: mean 0, std 1 (the code's)
    if cfg.scale_by_std:
        population = std * ((count - 1) / count.clamp(min=1)).sqrt()
        centred = centred / (torch.where(several, population, torch.ones_like(std)) + cfg.adv_eps)
    adv = torch.zeros_like(r)
    adv[keep] = centred
    return _per_token(adv, mask, token_rewards, cfg)
