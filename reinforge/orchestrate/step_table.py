"""The step as a table of declared stages: each stage, where it runs, the record fields it reads and
writes. The stages after collection declare theirs on their classes (orchestrate/stages.py), the batch's
on-demand fields on their producers (orchestrate/batch_fields.py), the learner's passes in
learn/prepare.py; the rest are declared here. docs/architecture.md shows ``markdown_table()``
(tests/test_step_table.py keeps the two equal and records the stages' reads and writes)."""

from __future__ import annotations

from dataclasses import dataclass

from reinforge.learn.prepare import ADVANTAGE_WRITES, PREPARE_WRITES
from reinforge.orchestrate.batch_fields import PRODUCERS
from reinforge.orchestrate.stages import BudgetStage, PromptValueStage, ReplayStage, StateValueStage


@dataclass(frozen=True)
class StepStage:
    name: str
    where: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]


def _after_collection() -> list[StepStage]:
    return [StepStage(c.name, f"`stages.{c.__name__}` (learner process)", c.reads, c.writes)
            for c in (BudgetStage, ReplayStage, PromptValueStage, StateValueStage)]


def step_stages() -> list[StepStage]:
    """Every stage of one step, in order."""
    on_demand = tuple(w for p in PRODUCERS for w in p.writes)
    return [
        StepStage("collect", "`batch_sources.sample_round` (this process or a worker)", ("tasks",),
                  ("sampled", "kept", "baseline")),
        StepStage("shape", "`batch_sources.Rounds.add` (shapers, dynamic sampling)", ("sampled",),
                  ("sampled.reward", "sampled.trainable", "kept", "baseline")),
        *_after_collection(),
        StepStage("guidance", "`demo_batches.DemonstrationBatches`", ("kept",), ("kept",)),
        StepStage("build", "`episodes.build_batch` + `batch_fields` producers", ("kept", "baseline"),
                  ("the batch tensors", *on_demand)),
        StepStage("prepare", "`learn/prepare.py` `Learner.prepare`", ("input_ids", "loss_mask"), PREPARE_WRITES),
        StepStage("advantages", "`Learner.estimate_advantages`", ("what the estimator names",), ADVANTAGE_WRITES),
        StepStage("update", "`Learner.update`", ("what the loss and terms name",), ("policy", "optimizer")),
        StepStage("publish", "`Loop.publish_weights`", ("policy",), ("engine weights", "version")),
    ]


def markdown_table() -> str:
    """The step table of docs/architecture.md."""
    rows = ["| stage | where | reads | writes |", "|---|---|---|---|"]
    for s in step_stages():
        rows.append(f"| {s.name} | {s.where} | {', '.join(s.reads) or '—'} | {', '.join(s.writes) or '—'} |")
    return "\n".join(rows)
