"""Seeded train / held-out splits of a procedural task grid: task ``i`` is ``make(i)``; a seeded random
subset of indices is held out and the rest is train, so the splits never overlap and ids are stable."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reinforge.data.base import IndexedSplit, TaskSplits
from reinforge.types import Task

MAX_GRID = 3_000_000  # problems per source (the seeded permutation holds one int64 each)


def grid_splits(total: int, heldout_size: int, seed: int, make: Callable[[int], Task], name: str) -> TaskSplits:
    """``heldout_size`` of the ``total`` indices (seeded) held out, the rest train, both sorted."""
    if isinstance(heldout_size, bool) or not isinstance(heldout_size, int) or not 0 < heldout_size < total:
        raise ValueError(f"heldout_size must be in 1..{total - 1}, got {heldout_size!r}")
    perm = np.random.default_rng(seed).permutation(total)
    return TaskSplits(
        train=IndexedSplit(np.sort(perm[heldout_size:]), make),
        heldout=IndexedSplit(np.sort(perm[:heldout_size]), make),
        name=name,
    )
