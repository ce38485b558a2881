"""The step as declared stages (orchestrate/step_table.py): docs/architecture.md shows the generated table,
and each stage, run on a recording record, reads and writes exactly what it declares."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch

from reinforge.config import load_config
from reinforge.data.budgets import build_budget
from reinforge.learn.prepare import ADVANTAGE_WRITES, PREPARE_WRITES
from reinforge.orchestrate.batch_fields import PRODUCERS, produce_fields
from reinforge.orchestrate.batch_sources import Rollout
from reinforge.orchestrate.collectors import Collected
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.replay import ReplayBuffer
from reinforge.orchestrate.stages import (
    BudgetStage,
    PromptValueStage,
    ReplayStage,
    StateValueStage,
)
from reinforge.orchestrate.state_values import CutSettings, StateValues
from reinforge.orchestrate.step_table import markdown_table
from reinforge.orchestrate.value_estimates import OptimalValues, ValueSettings
from reinforge.rollout.types import SamplingParams
from reinforge.types import Batch, Task, Trajectory

ROLLOUT_FIELDS = frozenset(f.name for f in dataclasses.fields(Rollout))
BATCH_FIELDS = frozenset(f.name for f in dataclasses.fields(Batch))
PARAMS = SamplingParams(max_new_tokens=4, n=2)


def test_docs_architecture_shows_the_generated_step_table():
    docs = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    assert markdown_table() in docs, "docs/architecture.md's step table is stale; paste:\n" + markdown_table()


# ---- a recording record ------------------------------------------------------------------------


@dataclasses.dataclass
class Log:
    reads: set[str] = dataclasses.field(default_factory=set)
    writes: set[str] = dataclasses.field(default_factory=set)


class RecordingMetadata(dict):
    def __init__(self, log: Log, *args) -> None:
        super().__init__(*args)
        self.log = log

    def __setitem__(self, key, value) -> None:
        self.log.writes.add(f"kept.metadata.{key}")
        super().__setitem__(key, value)


class RecordingTrajectory(Trajectory):
    """Records every attribute it is given after construction as ``kept.<attribute>``."""

    def __setattr__(self, name, value) -> None:
        log = self.__dict__.get("_log")
        if log is not None:
            log.writes.add(f"kept.{name}")
        super().__setattr__(name, value)


class RecordingRollout(Rollout):
    """Records the fields read and written (``+=`` does both)."""

    def __getattribute__(self, name):
        if name in ROLLOUT_FIELDS:
            object.__getattribute__(self, "_log").reads.add(name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value) -> None:
        log = self.__dict__.get("_log")
        if log is not None and name in ROLLOUT_FIELDS:
            log.writes.add(name)
        object.__setattr__(self, name, value)


def _traj(log: Log, task: str, group: int, reward: float) -> Trajectory:
    t = RecordingTrajectory([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.5], 0, group, task, reward=reward)
    t.metadata = RecordingMetadata(log)
    t.__dict__["_log"] = log
    return t


def _rollout(log: Log) -> Rollout:
    rows = [_traj(log, task, g, r) for g, task in enumerate(("a", "b")) for r in (1.0, 0.0)]
    rollout = RecordingRollout(sampled=rows, kept=list(rows), baseline=None)
    rollout.__dict__["_log"] = log
    return rollout


def _check(stage, tasks, steps: int = 1) -> Log:
    log = Log()
    for step in range(1, steps + 1):
        stage.run(_rollout(log), tasks, step)
    assert log.reads <= set(stage.reads) | set(stage.writes), f"{stage.name} read undeclared {log.reads}"
    assert log.writes == set(stage.writes), f"{stage.name} wrote {log.writes}, declares {stage.writes}"
    return log


class ValueCollector:
    """Reference samples: task a always solved, b never (so b's rows leave the loss)."""

    def collect(self, tasks, params, seed, group_offset=0, independent=False):
        return Collected([Trajectory([1, 2], [0, 1], [0.0, 0.0], 0, g, t.id, reward=float(t.id == "a"))
                          for g, t in enumerate(tasks) for _ in range(params.n)])


class StateCollector:
    """Continues each state K times with reward 0.5."""

    engine = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids, **_: "x" * len(ids)))

    def continue_states(self, tasks, prompts, prefixes, params):
        return SimpleNamespace(rewards=[[0.5] * params.n for _ in tasks], tokens_generated=0, reward_s=0.0)


def test_every_stage_after_collection_reads_and_writes_what_it_declares():
    tasks = {"a": Task("a", "1+1=", "2"), "b": Task("b", "2+2=", "4")}
    budget = load_config(None, ["rollout.budget={name: knapsack, min_per_prompt: 1}"]).rollout.budget
    _check(BudgetStage(build_budget(budget.name, budget.settings())), tasks)
    replay = load_config(None, ["rollout.replay={name: recent, capacity: 4, min_to_replay: 2}"]).rollout.replay
    _check(ReplayStage(ReplayBuffer(replay.name, replay.settings(), 0)), tasks, steps=2)
    values = OptimalValues(ValueCollector(), ValueSettings(2, 0.5))
    _check(PromptValueStage(values, PARAMS), tasks)
    _check(StateValueStage(StateValues(StateCollector(), CutSettings(2, "tokens", 1, 2)), PARAMS), tasks)


# ---- the batch record: producers and the learner's passes --------------------------------------


class RecordingBatch(Batch):
    def __setattr__(self, name, value) -> None:
        log = self.__dict__.get("_log")
        if log is not None and name in BATCH_FIELDS:
            log.writes.add(name)
        object.__setattr__(self, name, value)


def _recording_batch(batch: Batch, log: Log) -> Batch:
    out = RecordingBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(Batch)})
    out.__dict__["_log"] = log
    return out


def _turn_rows() -> list[Trajectory]:
    rows = []
    for g, task in enumerate(("a", "b")):
        for r in (1.0, 0.0):
            t = Trajectory([1, 2, 3, 4], [0, 1, 0, 1], [0.0, -0.5, 0.0, -0.5], 0, g, task, reward=r,
                           turn_rewards=[0.0, r], turn_spans=[(1, 2), (3, 4)], turn_states=["s0", "s1"])
            t.metadata["state_values"] = [[1, 0.5], [3, 0.25]]
            rows.append(t)
    return rows


def test_each_field_producer_writes_exactly_its_fields(monkeypatch):
    """``produce_fields`` runs a producer when the run reads one of its fields; each writes its declared ones."""
    from reinforge.orchestrate import batch_fields

    algo = load_config(None, ["algo.skip_equal_reward_groups=false"]).algo
    batch, _ = build_batch(_turn_rows(), algo, pad_id=0)
    for producer in PRODUCERS:
        log = Log()
        recorded = _recording_batch(dataclasses.replace(batch, extra={}), log)
        monkeypatch.setattr(batch_fields, "read_fields", lambda _algo, p=producer: frozenset(p.writes[:1]))
        produce_fields(recorded, _turn_rows(), algo)
        assert log.writes | set(recorded.extra) == set(producer.writes), producer.make.__name__


def test_prepare_and_advantages_write_only_what_they_declare(tiny_model):
    """A run with a critic (GAE), the KL in the reward and two epochs fills every field the passes declare."""
    from reinforge.learn.critic import build_critic
    from reinforge.learn.learner import Learner
    from reinforge.models.loading import load_model

    cfg = load_config(None, ["preset=ppo", "algo.kl.coef=0.01", "algo.kl.placement=reward", "train.epochs=2",
                             "algo.skip_equal_reward_groups=false"])
    learner = Learner.for_run(tiny_model, cfg, load_model("tiny-base"),
                              build_critic("tiny-base", cfg.algo.critic, "float32", "cpu"))
    batch, _ = build_batch(_turn_rows(), cfg.algo, pad_id=0)
    prepared, estimated = Log(), Log()
    recorded = _recording_batch(batch, prepared)
    learner.prepare(recorded)
    recorded.__dict__["_log"] = estimated
    learner.estimate_advantages(recorded)
    assert prepared.writes <= set(PREPARE_WRITES) and {"old_logprobs", "ref_logprobs", "values"} <= prepared.writes
    assert estimated.writes == set(ADVANTAGE_WRITES)
    assert torch.isfinite(recorded.advantages).all()
