"""``DemonstrationBatches``: the batch source when a run trains on demonstrations (docs/sft.md).

Each step takes the next ``demonstrations.per_step`` rows of a seeded shuffle of the demonstrations
(a new shuffle every epoch). With ``demonstrations.mix: false`` they are the whole batch (SFT);
with ``mix: true`` they join the batch of the run's rollout source (synchronous or asynchronous).
Each demonstration row is a group of its own (group id < 0): advantage estimators leave it out,
only the terms that need demonstrations (``nll``) train on it. The order depends only on the seed
and the step, so a resumed run draws exactly what the interrupted one would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from reinforge.config import RunConfig
from reinforge.data.demonstrations import rows_to_demonstrations, task_demonstrations
from reinforge.data.tabular import table_rows
from reinforge.orchestrate.batch_sources import BatchSource, Rollout
from reinforge.types import Trajectory

SEED_OFFSET = 4_243  # the demonstrations' shuffle is apart from the run's other random streams


class DemonstrationBatches:
    """Demonstrations alone, or added to ``inner``'s rollout batches (see the module docstring)."""

    def __init__(self, demos: list[Trajectory], per_step: int, seed: int, inner: BatchSource | None = None) -> None:
        self.demos, self.per_step, self.seed, self.inner = demos, per_step, seed, inner

    def rows(self, step: int) -> list[Trajectory]:
        """Step ``step``'s demonstrations (1-based), each a group of its own (ids -1, -2, ...)."""
        n, out = len(self.demos), []
        for k in range((step - 1) * self.per_step, step * self.per_step):
            epoch, i = divmod(k, n)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + SEED_OFFSET + epoch))
            out.append(dataclasses.replace(self.demos[int(order[i])], group_id=-(len(out) + 1)))
        return out

    def collect(self, step: int) -> Rollout:
        rollout = self.inner.collect(step) if self.inner is not None else Rollout()
        demos = self.rows(step)
        rollout.kept = [*rollout.kept, *demos]
        if rollout.baseline is not None:
            rollout.baseline = [*rollout.baseline, *([0.0] * len(demos))]
        rollout.metrics = {**rollout.metrics, "demonstrations/rows": float(len(demos))}
        return rollout

    def published(self, model: torch.nn.Module, version: int) -> None:
        if self.inner is not None:
            self.inner.published(model, version)

    def state(self) -> dict[str, Any]:
        return self.inner.state() if self.inner is not None else {}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def load_demonstrations(cfg: RunConfig, tokenizer: Any, train_tasks: list, prompt_of: Callable[[Any], Any]
                        ) -> list[Trajectory]:
    """The run's demonstrations: a table (``demonstrations.path``) or the training tasks' answers ('task')."""
    d = cfg.demonstrations
    if d.path == "task":
        return task_demonstrations(train_tasks, tokenizer, prompt_of)
    return rows_to_demonstrations(table_rows(d.path, d.split), tokenizer, d.columns)


def demonstration_batches(c: Any, collector: Any, inner: Callable[[Any, Any], BatchSource] | None = None
                          ) -> DemonstrationBatches:
    """The loop's source factory for a run with ``demonstrations.path``: ``inner`` is the rollout source
    factory when ``demonstrations.mix`` (else None: demonstrations only)."""
    cfg = c.cfg
    env = c.make_env()
    demos = load_demonstrations(cfg, c.tokenizer, list(c.splits.train), lambda task: env.reset(task, cfg.seed))
    return DemonstrationBatches(demos, cfg.demonstrations.per_step, cfg.seed,
                                inner(c, collector) if inner is not None else None)
