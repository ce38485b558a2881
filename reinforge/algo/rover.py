"""ROVER: Random Policy Valuation for Diverse Reasoning (He et al. 2025, "Random Policy Valuation is Enough
for LLM Reasoning with Verifiable Rewards", arXiv:2509.24981; the loss as the authors' code computes it,
yuxiaooye/ROVER, Math/verl/workers/actor/dp_actor.py ``DataParallelROVERActor.update_policy`` and
``core_algos.compute_rover_loss``).

In a deterministic, tree-shaped MDP with binary terminal rewards the greedy policy of the *uniform* policy's
Q-function is optimal, so ROVER regresses the Q-values of the uniform random policy instead of iterating
policy evaluation and improvement. The Q-function is the policy's log-ratio to pi_old, Q(s_t, a_t) =
rho (log pi(a_t | s_t) - log pi_old(a_t | s_t)), whose softmax over the actions is the policy; the uniform
policy's value of the next state is the mean of Q over the vocabulary there. Per token t of sequence i:

    Q_t      = rho (log pi(y_t) - log pi_old(y_t))
    V_{t+1}  = rho (mean_a log pi(a | y_<=t) - mean_a log pi_old(a | y_<=t)),   0 after the last token
    target_t = A_i + s V_{t+1}   (A_i: the sequence's advantage, GRPO's in the authors' runs; s = next_q_scale)
    L_t      = (Q_t - sg(target_t))^2

aggregated as a token mean (the code's ``masked_mean``). The target is a constant (the code detaches it);
with one optimizer step per batch Q_t and V_{t+1} are 0 in value and the gradient is -2 rho A_i grad log
pi(y_t): a policy gradient; with several mini-batches the regression is what the paper describes.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.policy_losses import POLICY_LOSSES
from reinforge.registry import Settings


class ROVERSettings(Settings):
    """ROVER: the Q scale, the weight of the next state's value and the optional clip of Q."""

    rho: float = Field(1.0, gt=0, description="Q = rho (log pi - log pi_old) (the code's rover_t, 1.0)")
    next_q_scale: float = Field(1.0, ge=0, description="weight of the next state's uniform-policy value in the "
                                "target (the code's next_q_scale_factor, 1.0)")
    clip: float = Field(0.0, ge=0, lt=1, description="0: off (the authors' runs); c > 0: a Q above log(1 + c) "
                        "with the target above it, or below log(1 - c) with the target below, is held there "
                        "(no gradient; the code's use_rover_clip with clip_ratio c)")


def next_state_values(logp_vocab: Tensor, old_vocab_mean: Tensor, mask: Tensor, rho: float) -> Tensor:
    """V_{t+1} at position t: rho (mean_a log pi - mean_a log pi_old) at position t + 1 where it is a trained
    token, 0 elsewhere and after the last position ([N, T], with pi's gradient)."""
    gap = rho * (logp_vocab.mean(-1) - old_vocab_mean.to(logp_vocab.dtype)) * mask
    return torch.cat([gap[:, 1:], gap.new_zeros(gap.shape[0], 1)], dim=1)


def clipped_q(q: Tensor, target: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """Q held at log(1 + c) where Q > log(1 + c) and the target is above Q, at log(1 - c) where Q < log(1 - c)
    and the target below (constants: no gradient there); also the mask of held tokens."""
    high, low = math.log1p(clip), math.log1p(-clip)
    up, down = (target > q) & (q > high), (target < q) & (q < low)
    held = torch.where(up, torch.full_like(q, high), torch.where(down, torch.full_like(q, low), q))
    return held, up | down


@POLICY_LOSSES.register(
    "rover",
    formula="Q_t = rho (log pi(y_t) - log pi_old(y_t)); V_{t+1} = rho (mean_a log pi(a; y_<=t) - "
            "mean_a log pi_old(a; y_<=t)) (0 after the last token); L_t = (Q_t - sg(A_t + s V_{t+1}))^2",
    paper="He et al. 2025, ROVER: Random Policy Valuation for Diverse Reasoning (arXiv:2509.24981; authors' code)",
    needs=("old_vocab_mean",),
    settings=ROVERSettings,
)
def rover_loss(logp: Tensor, old_logp: Tensor, logp_vocab: Tensor | None, old_vocab_mean: Tensor | None,
               advantages: Tensor, mask: Tensor, cfg: ROVERSettings) -> tuple[Tensor, dict[str, Tensor]]:
    """ROVER's per-token squared error between the policy's Q-value and the uniform policy's target.
    Metrics: ``q`` (Q_t), ``next_q`` (s V_{t+1}), ``ratio`` (pi / pi_old), ``clip_frac`` (tokens held by the
    clip; 0 without it)."""
    if logp_vocab is None or old_vocab_mean is None:
        raise ValueError("policy loss 'rover' needs logp_vocab (the current policy's rows) and old_vocab_mean "
                         "(pi_old's mean log-probability over the vocabulary)")
    q = cfg.rho * (logp - old_logp)
    next_q = cfg.next_q_scale * next_state_values(logp_vocab, old_vocab_mean, mask, cfg.rho)
    target = (advantages + next_q).detach()
    held = torch.zeros_like(q, dtype=torch.bool)
    if cfg.clip > 0:
        q, held = clipped_q(q, target, cfg.clip)
    loss = (q - target) ** 2
    with torch.no_grad():
        metrics = {"q": q.detach(), "next_q": next_q.detach(), "ratio": torch.exp(logp - old_logp).detach(),
                   "clip_frac": held.to(logp.dtype)}
    return loss, metrics
