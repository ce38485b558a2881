"""HBPO's hierarchical budget exploration (Lyu et al. 2025, "Hierarchical Budget Policy Optimization for
Adaptive Reasoning", arXiv:2507.15844, section 3.1): the G rollouts of a prompt are split into K
subgroups, the k-th asked for a token budget b_k by a budget phrase ("I will answer the question
within b_k tokens") placed before the completion.

Row j of a group of G is in subgroup k = floor(j K / G) (equal subgroups when K divides G), with
b_k = round(budgets[k] * rollout.max_new_tokens): the same rows and budgets as the ``hbpo_budget``
reward shaper (algo/length_shapers.py) with the same ``budgets``, which scores each row under its
budget. The phrase is appended to the prompt's tokens, so it is part of the prompt the policy is
trained on (not of the completion); ``Generation.extra['budget']`` records b_k (in the trajectory's
metadata). Departure: HBPO writes the phrase right after the ``<think>`` tag opening the response;
here it follows the prompt (its chat template's generation prompt), which for a template ending in
``<think>`` is the same place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import Field, field_validator

from reinforge.registry import Settings
from reinforge.rollout.group_samplers import GROUP_SAMPLERS
from reinforge.rollout.types import Generation, GenerationRequest, SamplingParams


class BudgetGroupSettings(Settings):
    budgets: list[float] = Field([0.125, 0.25, 0.5, 0.625], min_length=1, description="the subgroups' token "
                                 "budgets as fractions of rollout.max_new_tokens (as hbpo_budget's budgets)")
    template: str = Field(" I will answer the question within {budget} tokens.", description="the budget "
                          "phrase appended to the prompt; {budget} is b_k in tokens")

    @field_validator("budgets")
    @classmethod
    def _fractions(cls, v: list[float]) -> list[float]:
        if any(not 0 < b <= 1 for b in v):
            raise ValueError(f"budgets are fractions of rollout.max_new_tokens in (0, 1], got {v}")
        return v


def subgroup_of(j: int, n: int, k: int) -> int:
    """The subgroup of row j of a group of n split into k: floor(j k / n)."""
    return (j * k) // n


@GROUP_SAMPLERS.register(
    "hbpo_budgets",
    formula="row j of G sampled from pi(. | x + phrase(b_k)), k = floor(j K / G), b_k = budgets[k] * max_new_tokens",
    paper="Lyu et al. 2025, HBPO hierarchical budget exploration (arXiv:2507.15844, section 3.1)",
    settings=BudgetGroupSettings,
)
def hbpo_budgets(engine: Any, requests: Sequence[GenerationRequest], params: SamplingParams,
                 cfg: BudgetGroupSettings) -> list[Generation]:
    """Each prompt's group in K budget subgroups (module docstring); one engine call per subgroup."""
    n, k = params.n, len(cfg.budgets)
    out: list[Generation | None] = [None] * (len(requests) * n)
    for sub, fraction in enumerate(cfg.budgets):
        rows = [j for j in range(n) if subgroup_of(j, n, k) == sub]
        if not rows:
            continue
        budget = round(fraction * params.max_new_tokens)
        phrase = list(engine.tokenizer(cfg.template.format(budget=budget), add_special_tokens=False)["input_ids"])
        asked = [dataclasses.replace(r, prompt_ids=list(r.prompt_ids) + phrase) for r in requests]
        gens = engine.generate(asked, dataclasses.replace(params, n=len(rows)))
        for r in range(len(requests)):
            for i, j in enumerate(rows):
                gen = gens[r * len(rows) + i]
                gen.sample_index = j
                gen.extra = {**gen.extra, "budget": budget}
                out[r * n + j] = gen
    return [g for g in out if g is not None]
