"""Segment Policy Optimization, SPO-chain (Guo et al. 2025, "Segment Policy Optimization: Effective
Segment-Level Credit Assignment in RL for Large Language Models", arXiv:2505.23564). Registered as
``segment_po`` (``spo`` is Single-stream Policy Optimization, algo/spo.py).

**Cutpoint partition.** A token sampled with probability p_t < rho (``prob_threshold``) is a cutpoint:
where the trajectory could have gone elsewhere, so where the value may change. Every ``cut_interval``-th
cutpoint (counting from the first) starts a new segment; the prompt's state is the first boundary. So
a completion is cut at positions p_1 < ... < p_{m-1} into segments k = [p_k, p_{k+1}), each (but the
first) starting with a low-probability token. The loop (orchestrate/state_values.py, ``step_split:
low_prob``) estimates V(s_k), s_k = y_<p_k, by the mean reward of K continuations of s_k by the current
policy (the chain-based MC estimate), at most ``max_cuts`` boundaries per completion.

**Segment advantage.** Every token of segment k gets the change of value over the segment (gamma = 1,
the outcome R the value after the last segment):

    A_k = V(s_{k+1}) - V(s_k),    V(s_m) = R

**Probability mask.** Only the segment's low-probability tokens (p_t < rho) keep A_k; the others get 0.
The advantages are whitened over the batch's low-probability tokens (``whiten``, the authors' setting:
mean and unbiased std over those tokens), the other tokens staying 0. The probabilities are the
engine's sampling probabilities (``sampling_logp``), the ones the cutpoints were chosen from.

Checked against the authors' code (github.com/AIFrameResearch/SPO,
``math_episode_generator_with_mc_advantages.py``, ``ppo_trainer.py``): cutpoints at p < 0.9 taken every
``cutpoint_interval`` (default 5), K = 9 rollouts, A = V(next boundary) - V(this boundary), whitening
over the p < 0.9 tokens. Departures: the code removes the high-probability tokens from the loss mask
(they leave the token-mean's denominator and every other term, e.g. the KL); here their advantage is 0
and they stay in the loss. The code computes the probabilities with the actor's forward before the
update; here the sampling log-probs (the same policy, the sampling temperature applied). The prompt's
value is always estimated here (the code only when the first token is a cutpoint; the tokens before the
first cutpoint are masked either way). ``max_cuts`` caps the boundaries (the code: none).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.vineppo import step_values
from reinforge.registry import Settings


class SegmentPOSettings(Settings):
    """The cutpoints, K, the probability mask and the whitening (the loop reads the first six)."""

    rollouts: int = Field(9, ge=1, description="K: continuations sampled from each segment boundary for its "
                          "Monte Carlo value (the paper: 9)")
    step_split: Literal["low_prob", "newline", "tokens"] = Field(
        "low_prob", description="segment boundaries: every cut_interval-th token sampled with probability below "
        "prob_threshold (low_prob, the paper's cutpoints), or VinePPO's lines / fixed token counts")
    step_tokens: int = Field(1, ge=1, description="tokens per segment with step_split: tokens")
    max_cuts: int = Field(25, ge=0, description="at most this many boundaries per completion after the prompt's "
                          "(the first ones; the rest of the completion is one segment)")
    prob_threshold: float = Field(0.9, gt=0, le=1, description="rho: a token sampled with probability below it is "
                                  "a cutpoint, and keeps its segment's advantage under the probability mask")
    cut_interval: int = Field(5, ge=1, description="cutpoints per segment (the authors' default: 5)")
    prob_mask: bool = Field(True, description="only the low-probability tokens keep the segment advantage")
    whiten: bool = Field(True, description="whiten over the batch's low-probability tokens (all tokens without "
                         "prob_mask)")
    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the std when whitening")


def masked_whiten_unbiased(x: Tensor, keep: Tensor, eps: float) -> Tensor:
    """(x - mean) / (std + eps) over the ``keep`` entries (unbiased std; 1 entry: std 0), 0 elsewhere."""
    values = x[keep]
    if values.numel() == 0:
        return torch.zeros_like(x)
    mean = values.mean()
    std = values.std() if values.numel() > 1 else values.new_zeros(())
    return torch.where(keep, (x - mean) / (std + eps), 0.0)


@ADVANTAGES.register(
    "segment_po",
    formula="A_t = [p_t < rho] (V(s_{k+1}) - V(s_k)) for token t of segment k, segments cut at every "
            "cut_interval-th token with p < rho, V(s) = mean reward of K continuations of s, V(s_m) = R; "
            "whitened over the batch's tokens with p < rho  [probability mask optional]",
    paper="Guo et al. 2025, Segment Policy Optimization (arXiv:2505.23564)",
    needs=("state_values", "ungrouped", "sampling_logp"),
    settings=SegmentPOSettings,
)
def segment_po_advantage(rewards: Tensor, mask: Tensor, cfg: SegmentPOSettings, sampling_logp: Tensor | None = None,
                         state_values: Tensor | None = None, state_mask: Tensor | None = None) -> Tensor:
    """SPO-chain's segment advantages under the probability mask (module docstring), per token."""
    if state_values is None or state_mask is None:  # no boundary estimated anywhere: one segment, A = R
        state_values = state_mask = torch.zeros_like(mask)
    before, after = step_values(rewards, mask, state_values, state_mask)
    keep = mask != 0
    if cfg.prob_mask and sampling_logp is not None:
        keep = keep & (sampling_logp.to(torch.float64).exp() < cfg.prob_threshold)
    adv = torch.where(keep, after - before, 0.0)
    if cfg.whiten:
        adv = masked_whiten_unbiased(adv, keep, cfg.adv_eps)
    return adv.to(mask.dtype)
