"""Splits of tasks and a seeded, resumable sampler over a split (the `Task` record is ``reinforge.types``'s)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from reinforge.types import Task


class IndexedSplit(Sequence[Task]):
    """Tasks made on demand from sorted grid indices (picklable: ``make`` is a partial of a module function)."""

    def __init__(self, indices: np.ndarray, make: Callable[[int], Task]) -> None:
        self.indices, self.make = indices, make

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> Task: ...
    @overload
    def __getitem__(self, i: slice) -> list[Task]: ...
    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self.make(int(j)) for j in self.indices[i]]
        return self.make(int(self.indices[i]))


@dataclass(frozen=True)
class TaskSplits:
    """Disjoint train and held-out splits of one task source."""

    train: Sequence[Task]
    heldout: Sequence[Task]
    name: str


class TaskSampler:
    """Draws training tasks without replacement, reshuffling every epoch from its own seed.

    The order depends only on the seed; ``state_dict`` saves the position so a resumed run
    draws exactly the tasks the uninterrupted run would have drawn.
    """

    def __init__(self, tasks: Sequence[Task], seed: int) -> None:
        if len(tasks) == 0:
            raise ValueError("cannot sample from an empty task split")
        self.tasks = tasks
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.tasks))

    def next_batch(self, n: int) -> list[Task]:
        out: list[Task] = []
        while len(out) < n:
            if self.position == len(self._order):
                self.epoch += 1
                self.position = 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(out), len(self._order) - self.position)
            idx = self._order[self.position : self.position + take]
            out.extend(self.tasks[int(i)] for i in idx)
            self.position += take
        return out

    def observe(self, trajectories: Sequence[Any]) -> None:
        """The step's scored trajectories (a uniform sampler ignores them)."""

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
