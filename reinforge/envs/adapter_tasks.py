"""``task: {kind: env}``: the tasks of an environment that brings its own (an adapter's catalogue).

An environment registered with ``tasks=`` (reinforge/envs/registry.py, `environment_task_splits`) makes its
train and held-out splits from its own parameters (``env.*``): a verifiers taskset's rows, an OpenEnv
server's reset seeds, TextArena game seeds. `seeded_splits` holds out a seeded random subset, so the splits
never overlap and the ids are stable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.types import Task


def seeded_splits(tasks: Sequence[Task], heldout_size: int, seed: int, name: str) -> TaskSplits:
    """``heldout_size`` of ``tasks`` held out (a seeded random subset), the rest train, both in order."""
    n = len(tasks)
    if not 0 < heldout_size < n:
        raise ValueError(f"task.heldout_size must be in 1..{n - 1} ({name} has {n} tasks), got {heldout_size}")
    held = set(np.random.default_rng(seed).permutation(n)[:heldout_size].tolist())
    return TaskSplits(train=[t for i, t in enumerate(tasks) if i not in held],
                      heldout=[t for i, t in enumerate(tasks) if i in held], name=name)
