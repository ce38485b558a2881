"""Loss aggregation with global denominators: a per-token loss [N, T] -> the scalar loss of the mini-batch.

    name                      L (m_it: the mask, l_it: the per-token loss)    paper
    token_mean                sum_{i,t} m_it l_it / sum_{i,t} m_it             DAPO, arXiv:2503.14476
    seq_mean_token_sum        (1/N) sum_i sum_t m_it l_it                      verl's seq-mean-token-sum
    seq_mean_token_mean       (1/N) sum_i (sum_t m_it l_it / sum_t m_it)       GRPO, arXiv:2402.03300
    seq_mean_token_sum_norm   (1/N) sum_i sum_t m_it l_it / L_max              Dr. GRPO, arXiv:2503.20783
    seq_sum_token_mean        sum_i (sum_t m_it l_it / sum_t m_it)             DCPO's OTM, arXiv:2509.02333

Aggregation signature (registered in ``LOSS_AGG``)::

    fn(values: Tensor[N,T], mask: Tensor[N,T], norm: AggNorm) -> Tensor (scalar)

The sequence means count only the rows with a loss token (N above; ``sequences_with_tokens``).
``AggNorm`` holds denominators computed once over the whole optimizer mini-batch, so summing
the aggregated loss of its micro-batches gives exactly the loss (and gradient) of the whole
mini-batch however it is split. An aggregation's settings (``seq_mean_token_sum_norm``'s
``max_len_norm``) are read by the learner into ``AggNorm``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field
from torch import Tensor

from reinforge.registry import Registry, Settings, kind


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
    def of(cls, mask: Tensor, max_len: float = 1.0, rows: Tensor | None = None) -> AggNorm:
        """The denominators of ``mask``'s tokens and of its sequences: the rows (every row, or the ``rows``
        [N] bool) with at least one masked token (``sequences_with_tokens``)."""
        seqs = float(sequences_with_tokens(mask, rows).sum())
        return cls(num_tokens=max(float(mask.sum()), 1.0), num_seqs=max(seqs, 1.0), max_len=max_len)


def sequences_with_tokens(mask: Tensor, rows: Tensor | None = None) -> Tensor:
    """[N] bool: the rows (of ``rows``, else all) that have a loss token. A row without one (a filtered
    overlong answer, a turn-less episode) adds nothing to a sequence mean, so it is no sequence of its
    denominator either, as in verl's and OpenRLHF's aggregations."""
    has = mask.sum(-1) > 0
    return has & rows.bool() if rows is not None else has


AggFn = Callable[[Tensor, Tensor, AggNorm], Tensor]
LOSS_AGG: Registry[AggFn] = kind("loss_agg", Registry("loss aggregation"))


class LengthNormSettings(Settings):
    """The constant length normaliser of ``seq_mean_token_sum_norm``."""

    max_len_norm: float = Field(0.0, ge=0, description="L_max; 0 = rollout.max_new_tokens")


def masked_seq_mean(values: Tensor, mask: Tensor) -> Tensor:
    """[N]: each row's mean over its masked tokens, sum_t m_t v_t / max(sum_t m_t, 1) (0 for an empty row)."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


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
    per_seq = masked_seq_mean(values, mask)
    return per_seq.sum() / norm.num_seqs


@LOSS_AGG.register(
    "seq_mean_token_sum_norm",
    formula="L = (1/N) sum_i sum_t m_it l_it / L_max",
    paper="Liu et al. 2025, Dr. GRPO (arXiv:2503.20783)",
    settings=LengthNormSettings,
)
def seq_mean_token_sum_norm(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """Sum over tokens divided by a constant maximum length, mean over sequences (no length bias);
    L_max = ``norm.max_len``, the ``max_len_norm`` option (or ``rollout.max_new_tokens``)."""
    return (values * mask).sum() / (norm.num_seqs * norm.max_len)


@LOSS_AGG.register(
    "seq_sum_token_mean",
    formula="L = sum_i (sum_t m_it l_it / sum_t m_it)",
    paper="Yang et al. 2025, DCPO's Only-Token-Mean (OTM) loss (arXiv:2509.02333)",
)
def seq_sum_token_mean(values: Tensor, mask: Tensor, norm: AggNorm) -> Tensor:
    """DCPO's OTM: each response's token mean, summed (not averaged) over the responses, so a
    response's weight is its advantage alone, whatever its length and the batch size."""
    return masked_seq_mean(values, mask).sum()
