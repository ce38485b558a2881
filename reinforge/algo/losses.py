"""Policy losses (per token) and loss aggregation with global denominators.

Policy loss signature (registered in ``POLICY_LOSSES``)::

    fn(logp: Tensor[N,T], old_logp: Tensor[N,T], advantages: Tensor[N,T], mask: Tensor[N,T], cfg)
        -> (loss: Tensor[N,T], metrics: dict[str, Tensor[N,T]])

``loss`` is per token (to be aggregated by a ``LOSS_AGG`` function); each metric is a per-token
tensor that the learner averages over masked tokens.

Aggregation signature (registered in ``LOSS_AGG``)::

    fn(values: Tensor[N,T], mask: Tensor[N,T], norm: AggNorm) -> Tensor (scalar)

``AggNorm`` holds denominators computed once over the whole optimizer mini-batch, so summing
the aggregated loss of its micro-batches gives exactly the loss (and gradient) of the whole
mini-batch however it is split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from reinforge.algo.registry import Registry


class PolicyLossFn(Protocol):
    def __call__(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: Any
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


@POLICY_LOSSES.register(
    "ppo_clip",
    formula="L_t = -min(rho_t A_t, clip(rho_t, 1-eps_low, 1+eps_high) A_t), rho_t = pi(a_t)/pi_old(a_t)",
    paper="Schulman et al. 2017, PPO (arXiv:1707.06347); clip-higher: Yu et al. 2025, DAPO (arXiv:2503.14476)",
)
def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: Any
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with separate lower and upper clip ranges (clip-higher).

    rho_t = exp(log pi(a_t) - log pi_old(a_t));
    L_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - clip_low, 1 + clip_high)).
    Metrics: ``clip_frac`` (tokens where the clipped term is the active one), ``ratio``,
    ``approx_kl_old`` (k3 between pi_old and pi).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "clip_frac": (clipped > unclipped).to(logp.dtype),
            "ratio": ratio.detach(),
            "approx_kl_old": torch.expm1(-log_ratio) + log_ratio,
        }
    return loss, metrics


@dataclass(frozen=True)
class AggNorm:
    """Global denominators of one optimizer mini-batch.

    ``num_tokens``: masked tokens in the mini-batch; ``num_seqs``: sequences in it;
    ``max_len``: the constant length normaliser of ``seq_mean_token_sum_norm``.
    """

    num_tokens: float
    num_seqs: float
    max_len: float = 1.0

    @classmethod
    def of(cls, mask: Tensor, max_len: float = 1.0) -> AggNorm:
        return cls(num_tokens=max(float(mask.sum()), 1.0), num_seqs=max(float(mask.shape[0]), 1.0), max_len=max_len)


AggFn = Callable[[Tensor, Tensor, AggNorm], Tensor]
LOSS_AGG: Registry[AggFn] = Registry("loss aggregation")


@LOSS_AGG.register(
    "token_mean",
    formula="L = sum_{i,t} m_it l_it / sum_{i,t} m_it",
    paper="Yu et al. 2025, DAPO token-level loss (arXiv:2503.14476)",
)
def token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Mean over all masked tokens of the mini-batch: every token weighs the same."""
    return (values * mask).sum() / norm.num_tokens


@LOSS_AGG.register(
    "seq_mean_token_sum",
    formula="L = (1/N) sum_i sum_t m_it l_it",
    paper="sequence-sum aggregation (REINFORCE-style; as in verl's seq-mean-token-sum)",
)
def seq_mean_token_sum(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Sum over each sequence's tokens, mean over sequences."""
    return (values * mask).sum() / norm.num_seqs


@LOSS_AGG.register(
    "seq_mean_token_mean",
    formula="L = (1/N) sum_i (sum_t m_it l_it / sum_t m_it)",
    paper="Shao et al. 2024, GRPO's original per-sequence mean (arXiv:2402.03300)",
)
def seq_mean_token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Mean over each sequence's tokens, then mean over sequences (empty sequences contribute 0)."""
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / norm.num_seqs


@LOSS_AGG.register(
    "seq_mean_token_sum_norm",
    formula="L = (1/N) sum_i sum_t m_it l_it / L_max",
    paper="Liu et al. 2025, Dr. GRPO (arXiv:2503.20783)",
)
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Sum over tokens divided by a constant maximum length, mean over sequences (no length bias)."""
    return (values * mask).sum() / (norm.num_seqs * norm.max_len)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-position entropy H = logsumexp(z) - sum_v softmax(z)_v z_v of the distribution softmax(z)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
