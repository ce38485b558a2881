"""Per-step training statistics: masked-token sums reported as means, reduced over ranks."""

from __future__ import annotations

from collections import defaultdict

from torch import Tensor

from reinforge.learn import distributed
from reinforge.types import Batch


class MetricSums:
    """Masked-token sums of per-token statistics, reported as means over all tokens seen."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, float] = defaultdict(float)

    def add_tokens(self, name: str, values: Tensor, mask: Tensor) -> None:
        self.sums[name] += float((values.detach() * mask).sum())
        self.counts[name] += float(mask.sum())

    def add_scalar(self, name: str, value: float) -> None:
        self.sums[name] += value
        self.counts[name] += 1

    def add_share(self, name: str, value: float) -> None:
        """This rank's share of a value that is the sum over ranks (a loss with global denominators)."""
        self.sums[name] += value
        self.counts[name] += 1.0 / distributed.world()

    def all_reduce(self) -> None:
        """Sums and counts over ranks, so the means weigh every token of every rank alike (the
        ``*_max`` entries: the maximum over ranks). A no-op with one process."""
        if distributed.world() == 1:
            return
        names = sorted(set().union(*distributed.all_gather_object(sorted(self.sums))))
        summed = [n for n in names if not n.endswith("_max")]
        maxed = [n for n in names if n.endswith("_max")]
        totals = distributed.all_reduce([self.sums.get(n, 0.0) for n in summed] +
                                        [self.counts.get(n, 0.0) for n in summed])
        peaks = distributed.all_reduce([self.sums.get(n, 0.0) for n in maxed], "max")
        for i, n in enumerate(summed):
            self.sums[n], self.counts[n] = totals[i], totals[len(summed) + i]
        for n, v in zip(maxed, peaks, strict=True):
            self.sums[n], self.counts[n] = v, 1.0

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / max(self.counts[k], 1.0) for k in self.sums}


def sampled_mask(mb: Batch) -> Tensor:
    """The loss mask of the sampled rows (demonstrations have no sampler and no rollout statistics)."""
    return mb.loss_mask if mb.demo is None else mb.loss_mask * (~mb.demo.bool())[:, None].to(mb.loss_mask.dtype)


def add_mismatch(stats: MetricSums, logp: Tensor, mb: Batch) -> None:
    """|log pi_learner - log pi_sampler| on sampled tokens: the rollout/training mismatch."""
    diff = (logp - mb.sampling_logprobs).abs()
    mask = sampled_mask(mb)
    stats.add_tokens("logprob_mismatch", diff, mask)
    masked = diff * mask
    stats.sums["logprob_mismatch_max"] = max(stats.sums.get("logprob_mismatch_max", 0.0), float(masked.max()))
    stats.counts["logprob_mismatch_max"] = 1.0


def batch_summary(mb: Batch) -> str:
    adv = mb.advantages[mb.loss_mask > 0]
    return (
        f"{len(mb)} sequences, {int(mb.loss_mask.sum())} trained tokens, "
        f"advantage min/max {adv.min().item() if adv.numel() else 0:.3g}/{adv.max().item() if adv.numel() else 0:.3g}, "
        f"sampling log-prob min {mb.sampling_logprobs.min().item():.3g}"
    )
