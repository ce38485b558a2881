"""Policy losses for off-policy (stale) data whose trust region is set by a statistic of the batch
(rho_t = pi(a_t) / pi_old(a_t)): BAPO's clip bounds, searched per batch so that the positive-advantage
tokens carry a target share of the loss, and M2PO's mask, which drops the tokens with the largest
squared log-ratio until the second moment of the rest is small.

Both statistics are computed inside the loss over the tokens of ``mask``, i.e. over the micro-batch
the loss is called on: exact for the mini-batch when it fits in one micro-batch (the demo's: a
mini-batch of 16 x 8 / train.minibatches rows of at most 8 completion tokens is far under
``train.micro_batch_tokens`` = 8192), per micro-batch otherwise.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.algo.losses import POLICY_LOSSES
from reinforge.registry import Settings


class BAPOSettings(Settings):
    """BAPO's target positive share rho_0 and the movable ranges and steps of its two clip bounds
    (explicit ratio bounds, not epsilons)."""

    pos_share: float = Field(0.4, ge=0, le=1, description="rho_0: the positive tokens' target share of the loss")
    clip_low_start: float = Field(0.6, gt=0, le=1, description="a-: the lower ratio bound to start from")
    clip_low_max: float = Field(0.9, gt=0, le=1, description="b-: the highest the lower bound may go")
    clip_low_step: float = Field(0.02, gt=0, description="delta_2: step of the lower bound")
    clip_high_start: float = Field(1.2, ge=1, description="a+: the upper ratio bound to start from")
    clip_high_max: float = Field(3.0, ge=1, description="b+: the highest the upper bound may go")
    clip_high_step: float = Field(0.05, gt=0, description="delta_1: step of the upper bound")

    @model_validator(mode="after")
    def _ranges(self) -> BAPOSettings:
        if self.clip_low_max < self.clip_low_start:
            raise ValueError("clip_low_max must be >= clip_low_start")
        if self.clip_high_max < self.clip_high_start:
            raise ValueError("clip_high_max must be >= clip_high_start")
        return self


def bapo_candidates(cfg: BAPOSettings) -> tuple[Tensor, Tensor]:
    """The (c_low, c_high) pairs BAPO tries, in order: c_high from a+ up by delta_1 to b+ (c_low = a-),
    then c_low from a- up by delta_2 to b- (c_high = b+)."""
    n_high = math.ceil((cfg.clip_high_max - cfg.clip_high_start) / cfg.clip_high_step - 1e-9)
    n_low = math.ceil((cfg.clip_low_max - cfg.clip_low_start) / cfg.clip_low_step - 1e-9)
    high = (cfg.clip_high_start + cfg.clip_high_step * torch.arange(n_high + 1, dtype=torch.float64)).clamp(
        max=cfg.clip_high_max)
    low = (cfg.clip_low_start + cfg.clip_low_step * torch.arange(1, n_low + 1, dtype=torch.float64)).clamp(
        max=cfg.clip_low_max)
    high[-1] = cfg.clip_high_max  # the last step lands on the maximum exactly (0.6 + 15 * 0.02 != 0.9 in floats)
    if len(low):
        low[-1] = cfg.clip_low_max
    lows = torch.cat([torch.full_like(high, cfg.clip_low_start), low])
    highs = torch.cat([high, torch.full_like(low, cfg.clip_high_max)])
    return lows, highs


def bapo_bounds(ratio: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: BAPOSettings
                ) -> tuple[float, float, float]:
    """(c_low, c_high, rho) for the masked tokens: the first candidate pair whose positive share
    rho = sum_{A>0} q |min(r A, clip(r, 0, c_high) A)| / sum_t q |min(r A, clip(r, c_low, c_high) A)|
    reaches rho_0 (q = pi_old(a_t)), else the last pair (both bounds at their maxima)."""
    on = mask.bool()
    r, a = ratio.detach()[on].double(), advantages.detach()[on].double()
    w = torch.exp(old_logp.detach()[on].double()) * a.abs()
    lows, highs = bapo_candidates(cfg)
    pos = ((a > 0) * w)[None, :] * torch.minimum(r[None, :], highs[:, None])  # [K, n]: |min(rA, clip(r,0,c_high)A)|
    neg = ((a < 0) * w)[None, :] * torch.maximum(r[None, :], lows[:, None])  # |min(rA, clip(r,c_low,c_high)A)|, A < 0
    p, total = pos.sum(-1), pos.sum(-1) + neg.sum(-1)
    share = torch.where(total > 0, p / total.clamp(min=1e-300), torch.ones_like(total))
    ok = torch.nonzero(share >= cfg.pos_share)
    k = int(ok[0, 0]) if len(ok) else len(share) - 1
    return float(lows[k]), float(highs[k]), float(share[k])


@POLICY_LOSSES.register(
    "bapo",
    formula=("L_t = -min(rho_t A_t, clip(rho_t, c_low, c_high) A_t); (c_low, c_high): the first of c_high = a+ .. b+ "
             "(step delta_1), then c_low = a- .. b- (step delta_2), with sum_{A>0} q |min(rho A, clip(rho, 0, c_high) A)| "
             ">= rho_0 sum_t q |min(rho A, clip(rho, c_low, c_high) A)|, q = pi_old(a_t), over the micro-batch"),
    paper="Xi et al. 2025, BAPO: Stabilizing Off-Policy Reinforcement Learning for LLMs via Balanced Policy "
          "Optimization with Adaptive Clipping (arXiv:2510.18927)",
    settings=BAPOSettings,
)
def bapo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: BAPOSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Balanced policy optimization with adaptive clipping: PPO's surrogate with ratio bounds
    [c_low, c_high] chosen for each batch. Starting from (a-, a+), c_high rises by delta_1 (letting in
    more low-probability positive tokens: entropy-raising updates) up to b+, then c_low by delta_2 up
    to b-, until the positive tokens' share rho of the loss reaches rho_0 (Algorithm 1 of the paper).
    rho is the paper's, each token weighted by its rollout probability q and valued by its clipped
    surrogate. Note that in this value a negative token counts |A| max(r, c_low), so raising c_low
    does not raise rho: the c_low phase runs to b- whenever c_high = b+ is not enough, i.e. the
    low-ratio negative tokens are then dropped from the gradient as far as allowed. Defaults: the
    paper's rho_0 0.4, [a-, b-] = [0.6, 0.9], [a+, b+] = [1.2, 3.0], delta_1 0.05, delta_2 0.02. The
    paper's pi_rollout is ``old_logp`` here (pi_old; in async runs the proximal policy, the stale
    behaviour -> proximal gap being ``algo.mismatch``'s). Batch statistic over ``mask``: per micro-batch.
    Metrics: ``clip_frac``, ``ratio``, ``bapo_clip_low``, ``bapo_clip_high``, ``bapo_pos_share``."""
    ratio = torch.exp(logp - old_logp)
    c_low, c_high, share = bapo_bounds(ratio, old_logp, advantages, mask, cfg)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, c_low, c_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {"clip_frac": (clipped > unclipped).to(logp.dtype), "ratio": ratio.detach(),
                   "bapo_clip_low": torch.full_like(ratio, c_low), "bapo_clip_high": torch.full_like(ratio, c_high),
                   "bapo_pos_share": torch.full_like(ratio, share)}
    return loss, metrics


class M2POSettings(Settings):
    """M2PO's bound on the second moment of the log importance ratio."""

    m2_threshold: float = Field(0.04, gt=0, description="tau_M2: mask tokens until mean (log r)^2 <= tau")


def m2po_mask(log_ratio: Tensor, advantages: Tensor, mask: Tensor, threshold: float) -> Tensor:
    """M2PO's Algorithm 1 ([N, T] bool, True = kept): over the trust-region tokens (A > 0 and r > 1, or
    A < 0 and r < 1) of ``mask``, drop the one with the largest (log r)^2 while the mean (log r)^2 of
    the trust-region tokens left exceeds ``threshold``. Sorted once: after dropping the k largest of
    n, the mean is (S - top_k sum) / (n - k); k is the first that brings it to ``threshold`` or below
    (k = n when none does)."""
    lr = log_ratio.detach()
    trust = mask.bool() & (((advantages > 0) & (lr > 0)) | ((advantages < 0) & (lr < 0)))
    idx = torch.nonzero(trust.flatten()).flatten()
    keep = torch.ones(lr.numel(), dtype=torch.bool, device=lr.device)
    if idx.numel():
        m2 = (lr.flatten()[idx].double()) ** 2
        values, order = torch.sort(m2, descending=True, stable=True)
        n = values.numel()
        removed = torch.cat([values.new_zeros(1), torch.cumsum(values, 0)[:-1]])  # sum of the k largest, k = 0..n-1
        means = (values.sum() - removed) / torch.arange(n, 0, -1, dtype=values.dtype, device=values.device)
        below = torch.nonzero(means <= threshold)
        k = int(below[0, 0]) if len(below) else n
        keep[idx[order[:k]]] = False
    return keep.view_as(lr)


@POLICY_LOSSES.register(
    "m2po",
    formula=("L_t = -M_t rho_t A_t; M_t = 0 for the trust-region tokens (A>0, rho>1 or A<0, rho<1) with the largest "
             "(log rho_t)^2, dropped until their mean (log rho)^2 <= tau_M2, over the micro-batch; else M_t = 1"),
    paper="Zheng et al. 2025, Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs? "
          "(M2PO) (arXiv:2510.01161)",
    settings=M2POSettings,
)
def m2po_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: M2POSettings
              ) -> tuple[Tensor, dict[str, Tensor]]:
    """Second-moment trust policy optimization: no epsilon clip; the unclipped surrogate rho A on
    every token except those M2PO's mask drops (``m2po_mask``: the largest (log rho)^2 among the tokens
    PPO could clip, until the second moment of the rest is <= tau = 0.04, the paper's single setting).
    A dropped token keeps its place in the denominator (the paper averages over all tokens, to mimic
    PPO's clip): use ``loss_agg: token_mean``. rho is against ``old_logp`` (pi_old; the paper's
    pi_behav; in async runs the proximal policy, the behaviour -> proximal gap left to
    ``algo.mismatch``). Batch statistic over ``mask``: per micro-batch. Metrics: ``clip_frac``
    (dropped tokens), ``ratio``, ``m2`` ((log rho)^2: its mean is the batch's M2 before masking)."""
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    keep = m2po_mask(log_ratio, advantages, mask, cfg.m2_threshold)
    loss = -advantages * ratio * keep.to(ratio.dtype)
    with torch.no_grad():
        metrics = {"clip_frac": (~keep).to(logp.dtype), "ratio": ratio.detach(), "m2": log_ratio.detach() ** 2}
    return loss, metrics
