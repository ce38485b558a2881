"""Thinking-mode prompts: group samplers that append a fixed text to every prompt before sampling (after
its chat template's generation prompt), so that the policy is trained on the modified prompt.

- ``autothink_ellipsis``: AutoThink's ellipsis prompt (Tu et al. 2025, arXiv:2505.10832, section 3):
  ``<think>\\n...\\n`` opens a thinking block that holds only an ellipsis, after which an R1-style model
  stochastically closes the block at once (no-think) or goes on thinking; the ``autothink`` reward
  shaper (algo/adaptive_think.py) classifies and rewards the two modes.
- ``thinkfree``: TFPI's ThinkFree operation (Xu et al. 2025, "Thinking-Free Policy Initialization Makes
  Distilled Reasoning Models More Effective and Efficient Reasoners", arXiv:2509.26226): the thinking
  block is closed in the prompt (``</think>`` appended), so the model answers without thinking, under
  TFPI's staged rollout lengths: stage k (from step ``stage_steps[k-1]`` on, counted in this sampler's
  calls, one per rollout step) samples at most ``stage_lengths[k] * rollout.max_new_tokens`` tokens.

The appended tokens are encoded without special tokens by the engine's tokenizer; a generation
records the text in ``extra['prompt_suffix']`` (and ThinkFree's stage budget in
``extra['thinkfree_budget']``). For a template whose generation prompt already ends in ``<think>\\n``
(DeepSeek-R1-Distill) the suffixes are ``...\\n`` and ``</think>`` (settings).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from reinforge.registry import Settings
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams

AUTOTHINK = "Tu et al. 2025, AutoThink ellipsis prompt (arXiv:2505.10832, section 3)"
TFPI = ("Xu et al. 2025, Thinking-Free Policy Initialization (TFPI, arXiv:2509.26226): the ThinkFree operation "
        "and multi-stage rollout lengths")


def with_suffix(engine: Any, requests: Sequence[GenerationRequest], suffix: str) -> list[GenerationRequest]:
    """The requests with ``suffix``'s tokens (no special tokens) appended to their prompts."""
    ids = list(engine.tokenizer(suffix, add_special_tokens=False)["input_ids"]) if suffix else []
    return [dataclasses.replace(r, prompt_ids=list(r.prompt_ids) + ids) for r in requests]


def tagged(gens: list[Generation], **extra: Any) -> list[Generation]:
    for g in gens:
        g.extra = {**g.extra, **extra}
    return gens


class EllipsisSettings(Settings):
    suffix: str = Field("<think>\n...\n", description="appended to every prompt: a thinking block holding an ellipsis")


@GROUP_SAMPLERS.register(
    "autothink_ellipsis",
    formula="y_1, ..., y_G ~ pi(. | x + '<think>\\n...\\n') independently",
    paper=AUTOTHINK,
    settings=EllipsisSettings,
)
def autothink_ellipsis(engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams,
                       cfg: EllipsisSettings) -> list[Generation]:
    """Every completion sampled from the prompt with the ellipsis appended: one engine call."""
    return tagged(engine.generate(with_suffix(engine, requests, cfg.suffix), params), prompt_suffix=cfg.suffix)


class ThinkFreeSettings(Settings):
    suffix: str = Field("</think>", description="appended to every prompt: closes the thinking block (TFPI's "
                        "direct </think> append; '<think>\\n\\n</think>\\n\\n' for a template that opens none)")
    stage_lengths: list[float] = Field([1.0], min_length=1, description="each stage's rollout length as a "
                                       "fraction of rollout.max_new_tokens (TFPI: growing, e.g. [0.25, 0.5, 1.0])")
    stage_steps: list[int] = Field([], description="the call (rollout step, 0-based) at which each stage after "
                                   "the first begins; one fewer than stage_lengths, increasing")

    @model_validator(mode="after")
    def _stages(self) -> ThinkFreeSettings:
        if any(not 0 < f <= 1 for f in self.stage_lengths):
            raise ValueError(f"stage_lengths are fractions of rollout.max_new_tokens in (0, 1], got {self.stage_lengths}")
        if len(self.stage_steps) != len(self.stage_lengths) - 1:
            raise ValueError("stage_steps needs one entry fewer than stage_lengths (the first stage starts at 0)")
        if any(b <= a for a, b in zip([0, *self.stage_steps], self.stage_steps, strict=False)):
            raise ValueError(f"stage_steps must increase from 1 on, got {self.stage_steps}")
        return self


def stage_budget(call: int, max_new_tokens: int, cfg: ThinkFreeSettings) -> int:
    """The rollout length of call ``call``: max(1, round(stage_lengths[k] * max_new_tokens)), k the number
    of stage_steps at or before ``call``."""
    k = sum(1 for s in cfg.stage_steps if s <= call)
    return max(1, round(cfg.stage_lengths[k] * max_new_tokens))


@GROUP_SAMPLERS.register(
    "thinkfree",
    formula="y_1, ..., y_G ~ pi(. | x + '</think>') independently, at most L_k = f_k * max_new_tokens tokens in stage k",
    paper=TFPI,
    settings=ThinkFreeSettings,
)
class ThinkFree:
    """TFPI's ThinkFree rollouts under staged lengths (module docstring); the call count is its state."""

    def __init__(self, cfg: ThinkFreeSettings | None = None) -> None:
        self.cfg = cfg or ThinkFreeSettings()
        self.calls = 0

    def sample(self, engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams) -> list[Generation]:
        budget = stage_budget(self.calls, params.max_new_tokens, self.cfg)
        self.calls += 1
        gens = engine.generate(with_suffix(engine, requests, self.cfg.suffix),
                               dataclasses.replace(params, max_new_tokens=budget))
        return tagged(gens, prompt_suffix=self.cfg.suffix, thinkfree_budget=budget)

    def state_dict(self) -> dict[str, Any]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calls = int(state.get("calls", 0))
