"""The step as a table of declared stages: each stage, where it runs, the record fields it reads and
writes, all declared on the code that runs them (``types.declares_stage`` on functions and methods;
the stages after collection as class attributes, orchestrate/stages.py and demo_batches.py; the
batch's on-demand fields on their producers, orchestrate/batch_fields.py). docs/architecture.md
shows ``markdown_table()``; tests/test_step_table.py keeps the two equal and records what each stage
reads and writes."""

from __future__ import annotations

from reinforge.learn.learner import Learner
from reinforge.orchestrate.answer_probs import AnswerProbStage
from reinforge.orchestrate.batch_fields import PRODUCERS
from reinforge.orchestrate.batch_sources import Rounds, sample_round
from reinforge.orchestrate.budget_scores import BudgetScoreStage
from reinforge.orchestrate.demo_batches import DemonstrationStage, GuidanceStage
from reinforge.orchestrate.episodes import build_batch
from reinforge.orchestrate.hint_stage import HintStage
from reinforge.orchestrate.loop import Loop
from reinforge.orchestrate.reference_rewards import ReferenceRewardStage
from reinforge.orchestrate.search_steps import SearchStepStage
from reinforge.orchestrate.stages import BudgetStage, PromptValueStage, ReplayStage, StateValueStage
from reinforge.types import StepStage

AFTER_COLLECTION = (ReferenceRewardStage, BudgetStage, HintStage, ReplayStage, PromptValueStage, StateValueStage,
                    BudgetScoreStage, AnswerProbStage, SearchStepStage, DemonstrationStage, GuidanceStage)


def step_stages() -> list[StepStage]:
    """Every stage of one step, in order."""
    after = [StepStage(c.name, f"`{c.__module__.removeprefix('reinforge.')}.{c.__name__}`", c.reads, c.writes)
             for c in AFTER_COLLECTION]
    fields = StepStage("fields", "`orchestrate.batch_fields` producers (those a part reads)", ("kept",),
                       tuple(w for p in PRODUCERS for w in p.writes))
    return [sample_round.step_stage, Rounds.add.step_stage, *after, build_batch.step_stage, fields,
            Learner.prepare.step_stage,
            Learner.estimate_advantages.step_stage, Learner.update.step_stage, Loop.publish_weights.step_stage]


def markdown_table() -> str:
    """The step table of docs/architecture.md."""
    rows = ["| stage | where | reads | writes |", "|---|---|---|---|"]
    for s in step_stages():
        rows.append(f"| {s.name} | {s.where} | {', '.join(s.reads) or '—'} | {', '.join(s.writes) or '—'} |")
    return "\n".join(rows)
