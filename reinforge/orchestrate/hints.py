"""Guidance by hints (``rollout.hints``): a group whose samples all failed is sampled again with a
hint, part of the prompt's reference solution, so that the group carries a learning signal.

A registered hint part (kind ``hints``) turns its settings into a ``HintPlan``: the hint fractions
omega_1 < omega_2 < ... tried stage by stage, and whether the hinted samples are trained in the
context they were sampled in (GHPO) or put back in the context without the hint and marked for the
importance correction of the ``guide`` policy loss (Guide, algo/hint_losses.py). The ``HintStage``
(orchestrate/hint_stage.py) runs after collection (orchestrate/stages.py), on the kept rows:

1. the failed groups: sampled (not given) groups none of whose rows is correct (``is_correct``);
2. for each omega_k in turn, every group still failed is sampled again, as many rows as it has, with
   the hint h = the first round(omega_k * len(s)) characters of its source s (``metadata[source]``,
   else the task's answer), and its rows are replaced by the new ones (a group solved at stage k is
   not sampled at stage k+1);
3. the new rows get the run's reward shaping (``algo.reward_shapers``), the group's id and task.

Where the hint goes (``placement``): ``prompt`` appends ``template`` (with the hint) to the prompt's
last message (the papers' way; the verifier scores the completion); ``response`` puts the hint's tokens
right after the generation prompt, as the start of the answer, and the verifier scores hint +
completion (for a model that cannot read an instruction, e.g. the character-level ``tiny-base``).
Either way the hint's tokens are context, not trained, unless the plan puts the rows back in the
unguided context: then a ``response`` hint's tokens become answer tokens the policy did not sample
(loss mask 1, sampling log-prob 0, as LUFFY's demonstration tokens) and a ``prompt`` hint is dropped.

Metrics: ``hints/groups`` (groups sampled again), ``hints/fraction`` (mean omega of their last
hint), ``hints/solved_groups`` (of them, those with a correct row after the hints), ``hints/reward``
(mean reward of the hinted rows). Needs a single-turn collector (its engine and reward pool); runs
before dynamic sampling cannot, so it refuses ``algo.dynamic_sampling`` (which would set the failed
groups aside first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from reinforge.data.prompt_stats import is_correct
from reinforge.registry import Registry, Settings, kind
from reinforge.types import Task, Trajectory

HINTS: Registry = kind("hints", Registry("hint guidance"))
GHPO_TEMPLATE = ("\n The following text is the beginning part of the answer, which you can refer to for solving "
                 "the problem:\n{hint}")


@dataclass(frozen=True)
class HintPlan:
    """What a hint part asks of the stage: the fractions tried in turn, whether the hinted rows go back
    to the unguided context (``unguided``, Guide), the hint's source key, placement and template."""

    fractions: tuple[float, ...]
    unguided: bool
    source: str
    placement: Literal["prompt", "response"]
    template: str


class HintSettings(Settings):
    source: str = Field("solution", description="task.metadata key of the text a hint is cut from (a reference "
                        "solution); a task without it: its answer")
    placement: Literal["prompt", "response"] = Field(
        "prompt", description="prompt: template (with the hint) appended to the prompt's last message, the "
        "completion scored; response: the hint starts the answer, hint + completion scored")
    template: str = Field(GHPO_TEMPLATE, description="placement prompt: the text appended, {hint} the hint "
                          "(GHPO's phrase)")


class GHPOSettings(HintSettings):
    fractions: list[float] = Field([0.25, 0.5, 0.75], min_length=1, description="the hint ratios omega_k of "
                                   "the stages, in increasing order (GHPO's linear schedule)")

    @field_validator("fractions")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        if any(not 0 < w <= 1 for w in v) or v != sorted(v):
            raise ValueError(f"fractions are increasing hint ratios in (0, 1], got {v}")
        return v


class GuideHintSettings(HintSettings):
    source: str = Field("hint", description="task.metadata key of the guidance (Guide's per-problem hint); a "
                        "task without it: its answer")
    fraction: float = Field(1.0, gt=0, le=1, description="the share of the source given (1: all of a written "
                            "hint; less when the source is the answer)")


@HINTS.register(
    "ghpo",
    formula="failed group (no correct row): for k = 1..K while failed, resample it from x + h_k, "
            "h_k = s[:round(omega_k |s|)], omega = (0.25, 0.5, 0.75); trained in the hinted context",
    paper="Liu et al. 2025, GHPO: Adaptive Guidance for Stable and Efficient LLM Reinforcement Learning "
          "(arXiv:2507.10628), adaptive prompt refinement",
    settings=GHPOSettings,
)
def ghpo(cfg: GHPOSettings) -> HintPlan:
    """GHPO's multi-stage guidance, as in the authors' ``GHPOTrainer._generate_and_score_completions``
    (github.com/hkgc-1/GHPO): difficulty detection (every sample of the group has accuracy reward <= 0),
    then the group is regenerated with 25%, else 50%, else 75% of the solution after GHPO's phrase,
    each stage only for the groups still failed; the last stage's rows stay, and the prompt trained on
    is the hinted one (on-policy). Departure: the hint is cut from ``metadata[source]`` (or the answer)
    by characters, as the authors' code cuts the solution string."""
    return HintPlan(tuple(cfg.fractions), False, cfg.source, cfg.placement, cfg.template)


@HINTS.register(
    "guide",
    formula="failed group (no correct row): resample it from x + h, h = s[:round(omega |s|)]; rows trained "
            "as x + completion, hinted = 1 (policy_loss guide: w_t = pi_theta(o_t | x, o_<t) / pi_old(o_t | x, h, o_<t))",
    paper="Nath et al. 2025, Guide, Adaptive Guidance Accelerates Reinforcement Learning of Reasoning Models "
          "(arXiv:2506.13923)",
    settings=GuideHintSettings,
)
def guide(cfg: GuideHintSettings) -> HintPlan:
    """Guide's adaptive guidance, as in the authors' ``RayPPOTrainer.rollout`` (github.com/vaskar-open-source-
    research/guide_rl, ``reroll_with_hints``): a prompt whose k rollouts all failed is rolled again with
    the hint in context; the new rollouts replace the group and are rebuilt on the original prompt
    (``original_input_ids``), their behaviour log-probs those of the hinted context
    (``importance_weighted_reroll``). Pair with ``algo.policy_loss: guide``. Departure: the authors'
    accuracy filter on the hinted groups is the run's ``algo.skip_equal_reward_groups``."""
    return HintPlan((cfg.fraction,), True, cfg.source, cfg.placement, cfg.template)


def hint_text(source: str, fraction: float) -> str:
    """The first round(fraction * len(source)) characters of ``source`` (Python's round: half to even)."""
    return source[: round(fraction * len(source))]


def hint_source(task: Task, key: str) -> str:
    """``task.metadata[key]`` (as text), else the task's answer."""
    value = task.metadata.get(key)
    return str(value) if value is not None else task.answer


def with_hint(task: Task, text: str) -> Task:
    """``task`` with ``text`` appended to its prompt (a chat prompt's last message)."""
    if isinstance(task.prompt, str):
        return dataclasses.replace(task, prompt=task.prompt + text)
    messages = [dict(m) for m in task.prompt]
    messages[-1]["content"] = messages[-1]["content"] + text
    return dataclasses.replace(task, prompt=messages)


def failed_groups(kept: Sequence[Trajectory]) -> dict[int, list[int]]:
    """Row indices of every sampled group (id >= 0, no demonstration) none of whose rows is correct."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(kept):
        if not t.demonstration and t.group_id >= 0:
            groups.setdefault(t.group_id, []).append(i)
    return {g: idx for g, idx in groups.items() if not any(is_correct(kept[i]) for i in idx)}
