"""Group helpers over a batch's ``group_index``: dense renumbering, per-group reductions and each row's
rank within its group, all as tensor ops (the length shapers', RED-Drop's)."""

from __future__ import annotations

import torch
from torch import Tensor


def dense_groups(group_index: Tensor) -> tuple[Tensor, int]:
    """(gid [N] long in [0, n_groups), n_groups): ``group_index`` renumbered densely; each row with a
    negative index gets a group of its own."""
    gi = group_index.to(torch.int64)
    if gi.numel() == 0:
        return gi, 0
    own = gi.max().clamp(min=0) + 1 + torch.arange(gi.numel())
    _, gid = torch.unique(torch.where(gi >= 0, gi, own), return_inverse=True)
    return gid, int(gid.max()) + 1


def group_reduce(values: Tensor, gid: Tensor, n_groups: int, how: str) -> Tensor:
    """Per row, the ``how`` ("amin", "amax", "sum") of ``values`` over the row's group (every group has a row)."""
    out = torch.zeros(n_groups, dtype=values.dtype).scatter_reduce(0, gid, values, how, include_self=False)
    return out[gid]


def rank_in_group(gid: Tensor, n_groups: int) -> tuple[Tensor, Tensor]:
    """(rank [N]: the row's position among its group's rows in batch order, size [N]: its group's size)."""
    n = gid.numel()
    pos = torch.empty_like(gid)
    pos[torch.argsort(gid, stable=True)] = torch.arange(n)
    first = group_reduce(pos, gid, n_groups, "amin")
    size = torch.bincount(gid, minlength=n_groups)[gid]
    return pos - first, size
