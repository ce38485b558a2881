"""The stages a step runs on its rollout after collection, in the learner's process, the same for
every batch source (``LocalBatches`` in this process, ``WorkerBatches`` over rollout workers):

    collect -> shape -> reference rewards -> budget -> hints -> replay -> prompt values -> state values
    -> budget scores -> answer probabilities -> search steps -> demonstrations or guidance
    -> (build, prepare, advantages, update, publish)

Each stage declares the rollout fields it reads and writes and owns its state (``state_dict`` /
``load_state_dict``, under its ``key`` in a checkpoint's ``state.json``); the run builds the stages its
config asks for (``build_stages``) and restores them from the checkpoint it resumes from, read and
verified once by the caller (orchestrate/run.py). Only the budget also acts before collection: the
source asks ``Stages.sizes`` how many samples each drawn prompt gets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from reinforge.data.budgets import BudgetPart, build_budget
from reinforge.orchestrate.answer_probs import answer_prob_stage
from reinforge.orchestrate.budget_scores import budget_score_stage
from reinforge.orchestrate.demo_batches import demonstration_stage
from reinforge.orchestrate.hint_stage import hint_stage
from reinforge.orchestrate.reference_rewards import reference_reward_stage
from reinforge.orchestrate.replay import ReplayBuffer
from reinforge.orchestrate.rollouts import KeptRowsStage, Rollout
from reinforge.orchestrate.search_steps import search_step_stage
from reinforge.orchestrate.state_values import state_value_stage
from reinforge.orchestrate.value_estimates import STATE_KEY, OptimalValues, prompt_values
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory

if TYPE_CHECKING:
    from reinforge.orchestrate.collectors import Collector
    from reinforge.orchestrate.components import Components


class RolloutStage(Protocol):
    """One stage after collection: ``run`` updates the step's ``Rollout`` (the fields in ``writes``,
    from those in ``reads``; ``kept.<attribute>`` is an attribute of the kept trajectories) and returns
    its metrics; ``key`` names its state in a checkpoint (None: it keeps none)."""

    name: str
    key: str | None
    reads: tuple[str, ...]
    writes: tuple[str, ...]

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...


class BudgetStage:
    """``rollout.budget`` (data/budgets.py): how many samples each prompt gets (``sizes``, asked before
    collection), then it observes the step's fresh samples."""

    name, key = "budget", "budget"
    reads, writes = ("sampled",), ()

    def __init__(self, budget: BudgetPart) -> None:
        self.budget = budget

    def sizes(self, tasks: Sequence[Task], group_size: int) -> list[int]:
        return self.budget.allocate(tasks, group_size)

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        self.budget.observe([t for t in rollout.sampled if not t.demonstration])
        return self.budget.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.budget.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.budget.load_state_dict(state)


class ReplayStage:
    """``rollout.replay`` (orchestrate/replay.py): each kept group's replayed rows go in right after it
    (with its baseline), then the buffer takes the step's fresh samples."""

    name, key = "replay", "replay"
    reads, writes = ("sampled", "kept", "baseline", "tokens_reused"), ("kept", "baseline", "tokens_reused")

    def __init__(self, replay: ReplayBuffer) -> None:
        self.replay = replay

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        fresh = [t for t in rollout.sampled if not t.demonstration]
        replayed = self.replay.mix(rollout.kept, step, 1 + max((t.group_id for t in rollout.sampled), default=-1))
        rollout.kept, rollout.baseline = interleave(rollout.kept, rollout.baseline, replayed)
        rollout.tokens_reused += sum(t.num_generated for t in replayed)
        self.replay.add(fresh, step)
        return self.replay.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.replay.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.replay.load_state_dict(state)


class PromptValueStage:
    """A value per prompt a part declares (``optimal_value``, ``reference_value``;
    orchestrate/value_estimates.py): each kept row's ``baseline`` is its prompt's value; the rows of a
    filtered prompt leave the loss (``trainable``)."""

    name, key = "prompt_values", STATE_KEY
    reads, writes = ("kept",), ("baseline", "kept.trainable")

    def __init__(self, values: OptimalValues, params: SamplingParams) -> None:
        self.values, self.params = values, params

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> dict[str, float]:
        order = list(dict.fromkeys(t.task_id for t in rollout.kept if not t.demonstration))
        values = dict(zip(order, self.values([tasks[i] for i in order], rollout.kept, self.params, step),
                          strict=True))
        rollout.baseline = [values.get(t.task_id, 0.0) for t in rollout.kept]
        return self.values.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.values.cache

    def load_state_dict(self, state: Any) -> None:
        self.values.cache.update({k: list(v) for k, v in state.items()})


class StateValueStage(KeptRowsStage):
    """Monte Carlo values of intermediate states (``state_values``, orchestrate/state_values.py) of every
    kept row, replayed ones included, from the current policy; nothing kept across steps."""

    name, writes = "state_values", ("kept.metadata.state_values",)


@dataclass
class Stages:
    """The run's stages after collection, in order (see the module docstring)."""

    stages: list[RolloutStage] = field(default_factory=list)

    def sizes(self, tasks: Sequence[Task], group_size: int) -> list[int] | None:
        """Samples per drawn prompt from the budget (None without one: ``group_size`` each)."""
        budget = next((s for s in self.stages if isinstance(s, BudgetStage)), None)
        return budget.sizes(tasks, group_size) if budget is not None else None

    def run(self, rollout: Rollout, tasks: Mapping[str, Task], step: int) -> None:
        for stage in self.stages:
            rollout.metrics.update(stage.run(rollout, tasks, step))

    def state_dict(self) -> dict[str, Any]:
        return {s.key: s.state_dict() for s in self.stages if s.key is not None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Each stage's state from a checkpoint's ``state.json`` (a stage absent there starts fresh)."""
        for s in self.stages:
            if s.key is not None and s.key in state:
                s.load_state_dict(state[s.key])


def build_stages(c: Components, collector: Collector, resumed: Mapping[str, Any] | None = None) -> Stages:
    """The stages the run's config asks for, over this process's ``collector`` (the current policy) and
    the components; their state from ``resumed`` (the ``state.json`` of the checkpoint resumed from)."""
    cfg, params = c.cfg, c.sampling_params()
    stages: list[RolloutStage] = []
    reference = reference_reward_stage(cfg.reward, cfg.task.verifier, c.engine, params)
    if reference is not None:  # first: every later stage, the task sampler and the metrics see its rewards
        stages.append(reference)
    if cfg.rollout.budget is not None:
        stages.append(BudgetStage(build_budget(cfg.rollout.budget.name, cfg.rollout.budget.settings())))
    hints = hint_stage(c, collector)  # before replay and values: they see the groups as hinted
    if hints is not None:
        stages.append(hints)
    if cfg.rollout.replay is not None:
        stages.append(ReplayStage(ReplayBuffer(cfg.rollout.replay.name, cfg.rollout.replay.settings(), cfg.seed)))
    values = prompt_values(c)
    if values is not None:
        stages.append(PromptValueStage(values, params))
    states = state_value_stage(cfg.algo, collector)
    if states is not None:
        stages.append(StateValueStage(states, params))
    budget_scores = budget_score_stage(cfg.algo, collector, params)  # AnytimeReasoner's scores at thinking budgets
    if budget_scores is not None:
        stages.append(budget_scores)
    for turn_stage in (answer_prob_stage(cfg.algo, c.engine, params), search_step_stage(cfg.algo)):
        if turn_stage is not None:  # IGPO's answer probabilities, StepSearch's search steps
            stages.append(turn_stage)
    demonstrations = demonstration_stage(c, collector)  # last: in-group guidance reads the prompt values
    if demonstrations is not None:
        stages.append(demonstrations)
    out = Stages(stages)
    out.load_state_dict(resumed or {})
    return out


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
