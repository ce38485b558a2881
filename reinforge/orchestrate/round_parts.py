"""The parts that shape a step's groups in the batch source: a rollout budget (``rollout.budget``:
how many samples each prompt gets, data/budgets.py) and a replay buffer (``rollout.replay``: past
samples mixed into each group, orchestrate/replay.py). ``LocalBatches`` asks ``sizes`` before each
round and calls ``finish`` on the step's rollout; their state goes into checkpoints (``state.json``,
keys ``budget`` and ``replay``) and is read back when a run resumes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reinforge.data.budgets import BudgetPart, build_budget
from reinforge.orchestrate.replay import ReplayBuffer
from reinforge.types import Task, Trajectory

BUDGET_KEY, REPLAY_KEY = "budget", "replay"


class RoundParts:
    """A budget and a replay buffer, either of them optional."""

    def __init__(self, budget: BudgetPart | None = None, replay: ReplayBuffer | None = None) -> None:
        self.budget, self.replay = budget, replay

    @classmethod
    def from_config(cls, rollout: Any, seed: int, run_dir: Path | None = None) -> RoundParts | None:
        """The run's parts (None when it has neither), their state from ``run_dir``'s latest checkpoint."""
        if rollout.budget is None and rollout.replay is None:
            return None
        budget = build_budget(rollout.budget.name, rollout.budget.settings()) if rollout.budget is not None else None
        replay = (ReplayBuffer(rollout.replay.name, rollout.replay.settings(), seed)
                  if rollout.replay is not None else None)
        parts = cls(budget, replay)
        state = saved_state(run_dir)
        if budget is not None and BUDGET_KEY in state:
            budget.load_state_dict(state[BUDGET_KEY])
        if replay is not None and REPLAY_KEY in state:
            replay.load_state_dict(state[REPLAY_KEY])
        return parts

    def sizes(self, tasks: Sequence[Task], group_size: int) -> list[int] | None:
        return self.budget.allocate(tasks, group_size) if self.budget is not None else None

    def finish(self, out: Any, step: int) -> None:
        """After a step's rounds (``out``: its ``Rollout``): the budget observes the samples; the
        replay buffer adds each kept group's replays after it in ``kept`` (and their baselines), then
        takes the step's samples."""
        fresh = [t for t in out.sampled if not t.demonstration]
        if self.budget is not None:
            self.budget.observe(fresh)
            out.metrics.update(self.budget.metrics())
        if self.replay is not None:
            replayed = self.replay.mix(out.kept, step, 1 + max((t.group_id for t in out.sampled), default=-1))
            out.kept, out.baseline = interleave(out.kept, out.baseline, replayed)
            out.tokens_reused += sum(t.num_generated for t in replayed)
            self.replay.add(fresh, step)
            out.metrics.update(self.replay.metrics())

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.budget is not None:
            state[BUDGET_KEY] = self.budget.state_dict()
        if self.replay is not None:
            state[REPLAY_KEY] = self.replay.state_dict()
        return state


def interleave(kept: list[Trajectory], baseline: list[float] | None, replayed: list[Trajectory]
               ) -> tuple[list[Trajectory], list[float] | None]:
    """``kept`` with each prompt's replayed rows right after its group (a replayed row takes the
    baseline of its prompt's kept rows)."""
    by_task: dict[str, list[Trajectory]] = {}
    for t in replayed:
        by_task.setdefault(t.task_id, []).append(t)
    last = {t.task_id: i for i, t in enumerate(kept) if not t.demonstration}
    rows: list[Trajectory] = []
    base: list[float] = []
    for i, t in enumerate(kept):
        rows.append(t)
        extra = by_task.pop(t.task_id, []) if last.get(t.task_id) == i else []
        rows += extra
        if baseline is not None:
            base += [baseline[i]] * (1 + len(extra))
    return rows, base if baseline is not None else None


def saved_state(run_dir: Path | None) -> dict[str, Any]:
    """``state.json`` of the checkpoint a run resumes from (empty without one)."""
    if run_dir is None:
        return {}
    from reinforge.learn.checkpoint import latest_valid_checkpoint

    ckpt = latest_valid_checkpoint(run_dir, warn=lambda _: None)
    return json.loads((ckpt / "state.json").read_text()) if ckpt is not None else {}
