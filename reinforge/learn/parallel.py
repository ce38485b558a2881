"""The learner's data-parallel strategy: every collective of an update, in one object.

With one process every method is the identity (or a no-op). With several ranks (DDP or FSDP2,
learn/distributed.py) each rank holds whole groups of the global batch, whose rows are all ranks'
rows in rank order: ``layout`` says where this rank's rows sit, ``norm`` gives a mini-batch's global
denominators, ``gather_rows`` puts every rank's advantage inputs together (batch-level statistics are
those of the global batch), ``reduce_grads`` sums DDP gradients (FSDP2 reduce-scatters them in its
last backward: ``sync_gradients``), ``equal_forwards`` keeps FSDP2 ranks in step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from reinforge.algo.aggregation import AggNorm, sequences_with_tokens
from reinforge.algo.value import explained_variance
from reinforge.learn import distributed
from reinforge.learn.critic import value_mask
from reinforge.types import Batch


class DataParallel:
    """The collectives of ``Learner.update`` for ``model`` (the wrapped policy)."""

    def __init__(self, model: nn.Module, parallel: str) -> None:
        self.model = model
        self.world = distributed.world()
        self.fsdp = self.world > 1 and parallel == "fsdp"

    def layout(self, rows: int) -> tuple[int, int]:
        """(offset of this rank's first row in the global batch, rows in the global batch)."""
        me = distributed.rank() if self.world > 1 else 0
        sizes = distributed.all_reduce([rows if r == me else 0 for r in range(self.world)])
        return int(sum(sizes[:me])), int(sum(sizes))

    def norm(self, mask: Tensor | None, max_len: float, rows: Tensor | None = None) -> AggNorm:
        """``AggNorm.of(mask, rows=rows)`` over every rank's rows of the mini-batch (None: no rows on this rank)."""
        seqs = float(sequences_with_tokens(mask, rows).sum()) if mask is not None else 0.0
        tokens, seqs = distributed.all_reduce([float(mask.sum()) if mask is not None else 0.0, seqs])
        return AggNorm(num_tokens=max(tokens, 1.0), num_seqs=max(seqs, 1.0), max_len=max_len)

    def gather_rows(self, inputs: dict[str, Tensor | None] | None) -> dict[str, Tensor | None] | None:
        """Every rank's [N]/[N, T] tensors as one batch (rows in rank order); the identity with one process."""
        return _concat_rows(distributed.all_gather_object(_to_cpu(inputs))) if self.world > 1 else inputs

    def my_rows(self, values: Tensor, offset: int, batch: Batch) -> Tensor:
        """This rank's rows of a tensor computed on the gathered global batch."""
        if self.world == 1:
            return values
        return values[offset: offset + len(batch), : batch.loss_mask.shape[1]].to(batch.loss_mask.device)

    def most_forwards(self, mine: int) -> int:
        """FSDP2: every rank must run the same number of policy forwards and backwards (each gathers
        the sharded weights with the other ranks): the most micro-batches any rank has."""
        return int(distributed.all_reduce([float(mine)], "max")[0]) if self.fsdp else mine

    def sync_gradients(self, last: bool) -> None:
        """FSDP2 reduce-scatters the accumulated gradients in the last backward of a step only."""
        if self.fsdp:
            self.model.set_requires_gradient_sync(last)

    def equal_forwards(self, mine: int, most: int, grad: bool) -> None:
        """A rank with ``mine`` < ``most`` micro-batches runs empty ones (one token, zero loss) to make
        up the difference; the last backward of the step reduce-scatters. A no-op for DDP and one process."""
        device = next(self.model.parameters()).device
        for i in range(mine, most):
            self.sync_gradients(i == most - 1)
            ids = torch.zeros((1, 1), dtype=torch.long, device=device)
            with torch.set_grad_enabled(grad):
                logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
                if grad:
                    (logits.float().sum() * 0.0).backward()

    def reduce_grads(self, params: list[nn.Parameter]) -> None:
        """DDP: sum the gradients over ranks (FSDP2 has reduce-scattered them; one process: nothing)."""
        if not self.fsdp:
            distributed.all_reduce_grads(params)

    def explained_variance(self, batch: Batch | None) -> float:
        """The critic's explained variance over every rank's trained tokens."""
        if self.world == 1:
            assert batch is not None and batch.values is not None and batch.returns is not None
            return explained_variance(batch.values, batch.returns, value_mask(batch))
        return _global_explained_variance(batch)


def _to_cpu(inputs: dict[str, Tensor | None] | None) -> dict[str, Tensor | None] | None:
    return None if inputs is None else {k: v.cpu() if v is not None else None for k, v in inputs.items()}


def _concat_rows(parts: list[dict[str, Tensor | None] | None]) -> dict[str, Tensor | None] | None:
    """Ranks' advantage inputs as one batch: rows in rank order, [N, L] tensors right-padded with
    zeros to the widest, group ids renumbered per rank (0, 1, ... in order of id) so that groups of
    different ranks never merge."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    width = max(p["mask"].shape[1] for p in parts)  # type: ignore[union-attr]
    out: dict[str, Tensor | None] = {}
    for key in parts[0]:
        values = [p[key] for p in parts]
        if values[0] is None:
            out[key] = None
        elif key == "group_index":
            ids, seen = [], 0
            for v in values:
                _, inverse = torch.unique(v, return_inverse=True)
                ids.append(inverse + seen)
                seen += int(inverse.max()) + 1 if inverse.numel() else 0
            out[key] = torch.cat(ids)
        elif values[0].dim() == 2:  # subgroup ids pad with -1 (none); the others with 0
            fill, wide = (-1, max(v.shape[1] for v in values)) if key == "subgroups" else (0, width)
            out[key] = torch.cat([torch.nn.functional.pad(v, (0, wide - v.shape[1]), value=fill) for v in values])
        else:
            out[key] = torch.cat(values)
    return out


def _global_explained_variance(batch: Batch | None) -> float:
    """``explained_variance`` over every rank's masked tokens (from all-reduced moments)."""
    r = v = torch.zeros(0, dtype=torch.float64)
    if batch is not None and batch.values is not None and batch.returns is not None:
        live = value_mask(batch) != 0
        r, v = batch.returns.detach().double()[live], batch.values.detach().double()[live]
    d = r - v
    n, sr, srr, sd, sdd = distributed.all_reduce([float(r.numel()), float(r.sum()), float((r * r).sum()),
                                                  float(d.sum()), float((d * d).sum())])
    if n == 0:
        return 0.0
    var_r, var_d = srr / n - (sr / n) ** 2, sdd / n - (sd / n) ** 2
    if var_r <= 1e-12 * max(srr / n, 1e-30):
        return 0.0
    return 1.0 - var_d / var_r
