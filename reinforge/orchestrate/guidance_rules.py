"""Which rollout groups gain their prompt's demonstration, and how (``demonstrations.guidance``, with
``demonstrations.placement: in_group``): a registered rule per group.

A rule maps one group (its samples' rewards and verdicts, and the prompt's reference value V_ref when
the run estimates one, else None) to an action: ``skip`` (no demonstration), ``add`` (the demonstration
joins the group as one more member) or ``replace`` (it takes the place of the group's last sample).
The loop (orchestrate/demo_batches.py) scores the demonstration with the run's verifier and gives it
the group's id and baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from reinforge.registry import Registry, Settings, kind

Action = Literal["skip", "add", "replace"]
GUIDANCE_RULES: Registry = kind("demo_guidance", Registry("demonstration guidance rule"))


@GUIDANCE_RULES.register(
    "every_group",
    formula="every group whose prompt has a demonstration gains it as one more member",
    paper="Yan et al. 2025, LUFFY, Learning to Reason under Off-Policy Guidance (arXiv:2504.14945)",
)
def every_group(rewards: Sequence[float], correct: Sequence[bool], reference: float | None, cfg: Any) -> Action:
    """LUFFY's mixed group: the expert's trace in every group."""
    return "add"


class FailedGroupSettings(Settings):
    replace: bool = Field(True, description="the ground-truth trajectory replaces the group's last sample (the "
                          "group keeps its size); false: it joins the group as one more member")
    max_reference_value: float | None = Field(
        0.0, description="inject only for prompts whose reference value V_ref (PVPO's pre-sampled mean reward of the "
        "reference policy) is at most this: the paper's zero-accuracy prompts; null: whatever V_ref (needs no V_ref)")


@GUIDANCE_RULES.register(
    "failed_groups",
    formula="a group none of whose samples is correct (and V_ref(x) <= max_reference_value) has its last sample "
            "replaced by the prompt's ground-truth trajectory",
    paper="Feng et al. 2025, PVPO: Pre-Estimated Value-Based Policy Optimization for Agentic Reasoning "
          "(arXiv:2508.21104), group sampling",
    settings=FailedGroupSettings,
)
def failed_groups(rewards: Sequence[float], correct: Sequence[bool], reference: float | None,
                  cfg: FailedGroupSettings) -> Action:
    """PVPO's ground-truth injection: where every sample of the group failed (on a prompt the reference
    policy never solved), a ground-truth trajectory gives the group a success to learn from.
    ``ValueError`` when ``max_reference_value`` is set and the run has no V_ref."""
    if any(correct):
        return "skip"
    if cfg.max_reference_value is not None:
        if reference is None:
            raise ValueError("demonstrations.guidance.max_reference_value: the run has no reference value V_ref; use "
                             "algo.advantage=pvpo (which estimates it) or set max_reference_value: null")
        if reference > cfg.max_reference_value:
            return "skip"
    return "replace" if cfg.replace else "add"
