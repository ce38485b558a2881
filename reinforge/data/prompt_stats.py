"""Per-prompt statistics a task sampler keeps over a run (``PromptStats``), saved in its checkpoints.

For every prompt (``Task.id``) observed so far: groups seen (times drawn), samples, successes (the
verifier's ``correct``; without one, ``reward > 0``), the sum and sum of squares of the rewards (so
its success rate and reward variance), the step it was last seen at, and the outcome of its last
``history`` groups (+1 all right, -1 all wrong, 0 mixed: DAPO's "zero-variance" groups are the
+1/-1 ones). A step is one ``update`` call: the loop hands the sampler each step's scored
trajectories once (``TaskSampler.observe``), so the step counter is the run's step.

Samplers compose it (``reinforge/data/curriculum.py``): ``update`` returns the step's groups
(``GroupOutcome``) for the sampler's own signal (DUMP's advantages, InSight's posteriors).
The state is plain JSON (``state.json`` of a checkpoint): a resumed run has the same statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from reinforge.types import Trajectory


@dataclass
class PromptRecord:
    """What the run has seen of one prompt."""

    groups: int = 0
    samples: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    reward_sq_sum: float = 0.0
    last_step: int = -1
    recent: list[int] = field(default_factory=list)  # last groups' outcomes: +1 all right, -1 all wrong, 0 mixed

    @property
    def success_rate(self) -> float:
        return self.successes / self.samples if self.samples else 0.0

    @property
    def reward_mean(self) -> float:
        return self.reward_sum / self.samples if self.samples else 0.0

    @property
    def reward_variance(self) -> float:
        """Population variance of every reward the prompt received."""
        return max(self.reward_sq_sum / self.samples - self.reward_mean**2, 0.0) if self.samples else 0.0

    def as_list(self) -> list[Any]:
        return [self.groups, self.samples, self.successes, self.reward_sum, self.reward_sq_sum, self.last_step,
                list(self.recent)]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> PromptRecord:
        g, n, s, rs, rq, last, recent = values
        return cls(int(g), int(n), int(s), float(rs), float(rq), int(last), [int(x) for x in recent])


@dataclass(frozen=True)
class GroupOutcome:
    """One observed group: its prompt, rewards and verdicts (in trajectory order)."""

    task_id: str
    group_id: int
    rewards: tuple[float, ...]
    correct: tuple[bool, ...]

    @property
    def outcome(self) -> int:
        """+1 every sample right, -1 every sample wrong, 0 mixed."""
        return 1 if all(self.correct) else -1 if not any(self.correct) else 0


def is_correct(t: Trajectory) -> bool:
    """The verifier's verdict (``metadata["correct"]``); a reward without one: ``reward > 0``."""
    return bool(t.metadata["correct"]) if "correct" in t.metadata else t.reward > 0


def group_outcomes(trajectories: Sequence[Trajectory]) -> list[GroupOutcome]:
    """The sampled (non-demonstration) trajectories grouped by (task id, group id), in first-seen order."""
    groups: dict[tuple[str, int], list[Trajectory]] = {}
    for t in trajectories:
        if not t.demonstration:
            groups.setdefault((t.task_id, t.group_id), []).append(t)
    return [GroupOutcome(tid, gid, tuple(float(t.reward) for t in ts), tuple(is_correct(t) for t in ts))
            for (tid, gid), ts in groups.items()]


class PromptStats:
    """Per-prompt records keyed by task id (see the module docstring); ``history`` group outcomes kept."""

    def __init__(self, history: int = 8) -> None:
        self.history = history
        self.step = 0
        self.records: dict[str, PromptRecord] = {}
        self.last_group_size = 0

    def get(self, task_id: str) -> PromptRecord | None:
        return self.records.get(task_id)

    def update(self, trajectories: Sequence[Trajectory]) -> list[GroupOutcome]:
        """Count one step's trajectories; returns its groups."""
        self.step += 1
        groups = group_outcomes(trajectories)
        for g in groups:
            r = self.records.setdefault(g.task_id, PromptRecord())
            r.groups += 1
            r.samples += len(g.rewards)
            r.successes += sum(g.correct)
            r.reward_sum += sum(g.rewards)
            r.reward_sq_sum += sum(x * x for x in g.rewards)
            r.last_step = self.step
            r.recent = (r.recent + [g.outcome])[-self.history:]
            self.last_group_size = len(g.rewards)
        return groups

    def zero_spread_streak(self, task_id: str) -> int:
        """How many of the prompt's latest groups in a row were all right or all wrong (the same way)."""
        r = self.records.get(task_id)
        if r is None or not r.recent or r.recent[-1] == 0:
            return 0
        streak = 0
        for o in reversed(r.recent):
            if o != r.recent[-1]:
                break
            streak += 1
        return streak

    def metrics(self) -> dict[str, float]:
        seen = self.records.values()
        n = max(len(self.records), 1)
        return {"sampler/prompts_seen": float(len(self.records)),
                "sampler/prompt_success_mean": sum(r.success_rate for r in seen) / n}

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history, "step": self.step, "last_group_size": self.last_group_size,
                "records": {k: r.as_list() for k, r in self.records.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history, self.step = int(state["history"]), int(state["step"])
        self.last_group_size = int(state["last_group_size"])
        self.records = {k: PromptRecord.from_list(v) for k, v in state["records"].items()}
