"""The step as declared stages (orchestrate/step_table.py): docs/architecture.md shows the generated table,
and each stage, run on a recording record, reads and writes exactly what it declares."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch

from reinforge.config import load_config
from reinforge.data.budgets import build_budget
from reinforge.learn.learner import Learner
from reinforge.learn.prepare import ADVANTAGE_WRITES, PREPARE_WRITES
from reinforge.orchestrate.answer_probs import AnswerProbs, AnswerProbStage
from reinforge.orchestrate.batch_fields import PRODUCERS, produce_fields
from reinforge.orchestrate.batch_sources import Rollout, Round, Rounds, sample_round
from reinforge.orchestrate.collectors import Collected
from reinforge.orchestrate.demo_batches import (
    DemonstrationBatches,
    DemonstrationStage,
    GroupGuidance,
    GuidanceStage,
)
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.reference_rewards import reference_reward_stage
from reinforge.orchestrate.replay import ReplayBuffer
from reinforge.orchestrate.search_steps import SearchStepStage
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
    rows: str = "kept"  # what the stage calls the trajectories it is given


class RecordingMetadata(dict):
    def __init__(self, log: Log, *args) -> None:
        super().__init__(*args)
        self.log = log

    def __setitem__(self, key, value) -> None:
        self.log.writes.add(f"{self.log.rows}.metadata.{key}")
        super().__setitem__(key, value)


class RecordingTrajectory(Trajectory):
    """Records every attribute it is given after construction as ``<rows>.<attribute>``."""

    def __setattr__(self, name, value) -> None:
        log = self.__dict__.get("_log")
        if log is not None:
            log.writes.add(f"{log.rows}.{name}")
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


def _traj(log: Log, task: str, group: int, reward: float, **kw) -> Trajectory:
    t = RecordingTrajectory([1, 2, 3, 4], [0, 0, 1, 1], [0.0, 0.0, -0.5, -0.5], 0, group, task, reward=reward, **kw)
    t.metadata = RecordingMetadata(log)
    t.__dict__["_log"] = log
    return t


def _rollout(log: Log, baseline: list[float] | None = None) -> Rollout:
    rows = [_traj(log, task, g, r) for g, task in enumerate(("a", "b")) for r in (1.0, 0.0)]
    rollout = RecordingRollout(sampled=rows, kept=list(rows), baseline=baseline)
    rollout.__dict__["_log"] = log
    return rollout


def _check(stage, tasks, steps: int = 1, baseline: list[float] | None = None) -> Log:
    log = Log()
    for step in range(1, steps + 1):
        stage.run(_rollout(log, baseline), tasks, step)
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


class _Uniform(torch.nn.Module):
    """Uniform next-token logits over 4 tokens (the answer-probabilities stage's model)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(4))

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.w.expand(*input_ids.shape, 4))


def test_the_search_steps_stage_writes_what_it_declares():
    log = Log()
    rows = []
    for g in range(2):
        t = _traj(log, "a", g, 1.0, turn_spans=[(2, 3), (3, 4)])
        t.__dict__["metadata"] = RecordingMetadata(log, {"observations": [["doc one"], ["doc one"]]})
        rows.append(t)
    rollout = RecordingRollout(sampled=rows, kept=list(rows))
    rollout.__dict__["_log"] = log
    stage = SearchStepStage(0.6, True, True)
    stage.run(rollout, {"a": Task("a", "q", "one", {"evidence": ["doc one"]})}, 1)
    assert log.reads <= set(stage.reads) | set(stage.writes) and log.writes == set(stage.writes)


def test_every_stage_after_collection_reads_and_writes_what_it_declares():
    tasks = {"a": Task("a", "1+1=", "2"), "b": Task("b", "2+2=", "4")}
    budget = load_config(None, ["rollout.budget={name: knapsack, min_per_prompt: 1}"]).rollout.budget
    _check(BudgetStage(build_budget(budget.name, budget.settings())), tasks)
    replay = load_config(None, ["rollout.replay={name: recent, capacity: 4, min_to_replay: 2}"]).rollout.replay
    _check(ReplayStage(ReplayBuffer(replay.name, replay.settings(), 0)), tasks, steps=2)
    values = OptimalValues(ValueCollector(), ValueSettings(2, 0.5))
    _check(PromptValueStage(values, PARAMS), tasks)
    _check(StateValueStage(StateValues(StateCollector(), CutSettings(2, "tokens", 1, 2)), PARAMS), tasks)
    from reinforge.algo.brpo import BRPOSettings
    from reinforge.orchestrate.budget_scores import BudgetScores, BudgetScoreStage
    scoring = SimpleNamespace(engine=StateCollector.engine, continue_states=None,
                              pool=SimpleNamespace(score=lambda ts, texts: [SimpleNamespace(reward=0.5)] * len(texts)))
    _check(BudgetScoreStage(BudgetScores(scoring, BRPOSettings(budgets=[0.5, 1.0])), PARAMS), tasks)
    engine = SimpleNamespace(model=_Uniform(), pad_id=0, tokenizer=SimpleNamespace(encode=lambda s, **_: [1] * len(s)))
    _check(AnswerProbStage(AnswerProbs(engine, "{answer}"), PARAMS), tasks)
    for verifier in ("rlpr", "dro_r3"):
        reward = load_config(None, [f"reward.terms=[{{name: r, verifier: {verifier}}}]"]).reward
        _check(reference_reward_stage(reward, "exact_match", engine, PARAMS), tasks, steps=2)
    demo = Trajectory([1, 2, 9], [0, 0, 1], [0.0, 0.0, 0.0], 0, -1, "a", completion_text="9", demonstration=True)
    _check(DemonstrationStage(DemonstrationBatches([demo], per_step=2, seed=0)), tasks, baseline=[0.5] * 4)
    guidance = GroupGuidance([demo], list(tasks.values()), lambda ts, texts: [1.0] * len(texts))
    log = _check(GuidanceStage(guidance), tasks, baseline=[0.5] * 4)
    assert log.writes == {"kept", "baseline"}


# ---- collection and shaping --------------------------------------------------------------------


class RecordingRound(Round):
    """Records the round's fields read and written (``Round(...)`` writes every field)."""

    def __getattribute__(self, name):
        if name in ROUND_FIELDS:
            object.__getattribute__(self, "_log").reads.add(name)
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value) -> None:
        if name in ROUND_FIELDS:
            RECORDING.writes.add(name)
        object.__setattr__(self, name, value)

    @property
    def _log(self) -> Log:
        return RECORDING


RECORDING = Log()
ROUND_FIELDS = frozenset(f.name for f in dataclasses.fields(Round))


class RowCollector:
    """Two recording rows per task (rewards 1 and 0); ``n`` of them per task."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def collect(self, tasks, params, seed, group_offset=0, independent=False):
        return Collected([_traj(self.log, t.id, group_offset + g, float(k == 0))
                          for g, t in enumerate(tasks) for k in range(params.n)])


def _in_place_writes(obj, before: dict) -> set[str]:
    """The fields whose value a stage changed in place (``+=`` on a list, a dict updated)."""
    return {k for k, v in before.items() if object.__getattribute__(obj, k) != v}


def test_collect_and_shape_read_and_write_what_they_declare(monkeypatch):
    """``sample_round`` (a budget's sizes, the greedy baseline) and ``Rounds.add`` (two shapers, dynamic
    sampling), each on recording records."""
    from reinforge.orchestrate import batch_sources

    global RECORDING
    tasks = [Task("a", "1+1=", "2"), Task("b", "2+2=", "4")]
    RECORDING = collected = Log(rows="trajectories")
    monkeypatch.setattr(batch_sources, "Round", RecordingRound)
    round_ = sample_round(RowCollector(collected), tasks, PARAMS, 1, 0, with_baseline=True, sizes=[2, 3])
    declared = sample_round.step_stage
    assert collected.writes == set(declared.writes) and collected.reads <= set(declared.reads)
    algo = load_config(None, ["algo.reward_shapers=[{name: overlong_penalty}, {name: overlong_filter}]",
                              "algo.dynamic_sampling=true"]).algo
    RECORDING = shaped = Log(rows="sampled")
    for t in round_.trajectories:
        t.__dict__["_log"] = t.metadata.log = shaped
        t.finish_reason = "length"
    round_.metrics = {"env/calls": 3.0}  # an environment's counters
    shaped.writes.clear()
    rounds = Rounds(algo, max_new_tokens=2, want=2)
    out = rounds.out = RecordingRollout()
    out.__dict__["_log"] = shaped
    before = {f: copy.deepcopy(object.__getattribute__(out, f)) for f in ROLLOUT_FIELDS}
    rounds.add(round_, 0)
    writes = {w.replace("overlong_penalty", "<shaper>").replace("overlong_filter", "<shaper>")
              for w in shaped.writes | _in_place_writes(out, before)}
    declared = Rounds.add.step_stage
    assert writes == set(declared.writes), writes ^ set(declared.writes)
    assert shaped.reads - ROLLOUT_FIELDS <= set(declared.reads)


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


def test_prepare_advantages_and_update_write_only_what_they_declare(tiny_model):
    """A run with a critic (GAE), the KL in the reward and two epochs fills every field the passes declare;
    the update then changes the policy, its optimizer and the critic, and no field of the batch."""
    from reinforge.learn.critic import build_critic
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
    # the update writes nothing into the batch: the policy, its optimizer and the critic change
    updated = Log()
    recorded.__dict__["_log"] = updated
    policy = [p.detach().clone() for p in learner.model.parameters()]
    critic = [p.detach().clone() for p in learner.critic.model.parameters()]
    learner.update(recorded)
    changed = {"policy": any(not torch.equal(a, b) for a, b in zip(policy, learner.model.parameters(), strict=True)),
               "critic": any(not torch.equal(a, b) for a, b in zip(critic, learner.critic.model.parameters(), strict=True)),
               "optimizer": len(learner.optimizer.state) > 0}
    assert updated.writes == set() and {k for k, v in changed.items() if v} == set(Learner.update.step_stage.writes)


def test_build_writes_only_what_it_declares():
    """``build_batch`` changes no trajectory and fills only its declared fields (the producers' are
    checked above), the always-present ones among them."""
    log = Log()
    rows = [_traj(log, task, g, r) for g, task in enumerate(("a", "b")) for r in (1.0, 0.0)]
    algo = load_config(None, ["algo.skip_equal_reward_groups=false"]).algo
    batch, _ = build_batch(rows, algo, pad_id=0, baseline=[0.5] * 4)
    filled = {f.name for f in dataclasses.fields(Batch) if f.name != "extra" and getattr(batch, f.name) is not None}
    declared = set(build_batch.step_stage.writes)
    assert log.writes == set() and filled <= declared
    assert {"input_ids", "attention_mask", "loss_mask", "sampling_logprobs", "prefix_len", "group_index", "rewards",
            "baseline"} <= filled


def test_publish_reads_the_policy_and_writes_the_engines_weights_and_version():
    """``Loop.publish_weights`` hands the learner's model and the new version to the loop's engine and
    to the source (rollout workers), and nothing else."""
    from reinforge.orchestrate.loop import Loop

    log, model = Log(), torch.nn.Linear(2, 2)

    class Engine:
        def update_weights(self, weights, version) -> None:
            log.writes |= {"engine weights"} if weights is model else set()
            log.writes |= {"version"} if version == 7 else set()

    class Learner_:
        def __getattribute__(self, name):
            log.reads.add("policy" if name == "model" else name)
            return model

    published = []
    loop = SimpleNamespace(c=SimpleNamespace(engine=Engine(), learner=Learner_()),
                           source=SimpleNamespace(published=lambda m, v: published.append((m, v))))
    Loop.publish_weights(loop, 7)
    declared = Loop.publish_weights.step_stage
    assert log.reads == set(declared.reads) and log.writes == set(declared.writes) and published == [(model, 7)]
