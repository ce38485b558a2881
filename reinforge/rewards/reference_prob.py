"""Rewards from the policy's own likelihood of the reference answer after each sample's reasoning: RLPR's
probability reward and DRO's Reasoning Reflection Reward (R3). docs/rewards.md ("The policy's probability
of the reference") has each one's formula, paper, options and departures.

A verifier sees text in a CPU pool; these rewards need a forward pass of the policy. So the two verifiers
registered here are placeholders in the pool: reward 0, ``correct`` the sample's agreement with the gold
answer (``gold_verifier``, as the voting verifiers do) and the extracted answer. They declare the need
``reference_logp``: the reference-rewards stage (orchestrate/reference_rewards.py) runs, after rollout, the
rollout engine's copy of the policy teacher-forced on each sample's reasoning followed by the reference
answer's tokens, and on the prompt followed by them, and sets the term's value with the functions below.

The reasoning of a completion is its text before the answer ``extract_answer`` reads (``answer_start``:
the content of the last box, ``<answer>`` tag or ``answer:`` label, else the last number); a completion
without an answer is all reasoning, the reference appended at its end. On a task whose completions are the
bare answer (the arithmetic task: ``46``) the reasoning is empty and every sample of a group gets the same
value.

Options are the term's ``params`` (checked against the settings below when the config loads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from reinforge.registry import Settings
from reinforge.rewards.label_free import DEFAULT_GOLD_VERIFIER, gold_correct
from reinforge.rewards.math import answer_start, extract_answer
from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, RewardResult
from reinforge.types import Task

REFERENCE_LOGP = "reference_logp"


class ReferenceSettings(Settings):
    gold_verifier: str = Field(DEFAULT_GOLD_VERIFIER, description="judges `correct` against the gold answer "
                               "(metrics and held-out accuracy only; the reward never sees it)")
    number_fallback: bool = Field(True, description="a completion's last number is its answer when it has no "
                                  "box, tag or label (where its reasoning ends)")


class RLPRSettings(ReferenceSettings):
    debias: bool = Field(True, description="subtract the probability of the reference right after the prompt "
                         "(no reasoning), then clip to [0, 1]")
    std_filter: bool = Field(True, description="drop the groups whose reward std is below std_filter_beta x the "
                             "EMA of the steps' mean group std")
    std_filter_beta: float = Field(0.5, gt=0, description="the threshold's factor (the authors' std_filter_beta)")
    std_ema_decay: float = Field(0.99, ge=0, lt=1, description="EMA decay of the mean group std (filter_ema_ratio)")
    std_filter_warmup: int = Field(10, ge=0, description="steps whose stds enter the EMA before the filter acts")


class R3Settings(ReferenceSettings):
    weighting: Literal["std", "uniform"] = Field(
        "std", description="std: token weights sigma_j / sum_k sigma_k; uniform: 1/|y| (DRO-Aggr, the ablation)")
    masked_baseline: bool = Field(True, description="subtract each token's log-probability right after the prompt "
                                  "(the masked-CoT baseline)")
    low_variation_drop: float = Field(0.0, ge=0, lt=1, description="drop this fraction of the step's groups with "
                                      "the lowest max_j sigma_j (DRO's low reasoning variation filter)")
    difficulty_top_k: int | None = Field(None, ge=1, description="drop a group when no sample's mean rank of its "
                                         "hardest reference tokens is within the top k (None: off)")
    difficulty_fraction: float = Field(0.1, gt=0, le=1, description="the hardest fraction rho of the reference "
                                       "tokens whose ranks are averaged")


def placeholder(task: Task, completion: str) -> RewardResult:
    """The pool's result for a term the stage scores: 0 until the stage sets it; gold ``correct``; the answer."""
    fallback = bool(task.metadata.get("number_fallback", True))
    return RewardResult(0.0, gold_correct(task, completion), extract_answer(completion, number_fallback=fallback))


@VERIFIERS.register(
    "rlpr",
    formula="r_i = clip(mean_j pi(y*_j | x, z_i, y*_<j) - mean_j pi(y*_j | x, y*_<j), 0, 1) (z_i: sample i's "
            "reasoning, y*: the reference answer); groups with std(r) < beta * EMA(mean group std) are dropped",
    paper="Yu et al. 2025, RLPR: Extrapolating RLVR to General Domains without Verifiers (arXiv:2506.18254)",
    needs=(CPU_BOUND, REFERENCE_LOGP),
    settings=RLPRSettings,
)
def rlpr(task: Task, completion: str) -> RewardResult:
    """RLPR's debiased probability reward, set after rollout by the reference-rewards stage (0 in the pool);
    ``correct``: agreement with the gold answer (``gold_verifier``)."""
    return placeholder(task, completion)


@VERIFIERS.register(
    "dro_r3",
    formula="r_i = sum_j w_j (log pi(y_j | x, c_i, y_<j) - log pi(y_j | x, y_<j)), w_j = sigma_j / sum_k sigma_k, "
            "sigma_j = std over the group's samples i of log pi(y_j | x, c_i, y_<j) (c_i: sample i's reasoning)",
    paper="Xu et al. 2025, Direct Reasoning Optimization: LLMs Can Reward And Refine Their Own Reasoning for "
          "Open-Ended Tasks (arXiv:2506.13351), R3",
    needs=(CPU_BOUND, REFERENCE_LOGP),
    settings=R3Settings,
)
def dro_r3(task: Task, completion: str) -> RewardResult:
    """DRO's Reasoning Reflection Reward, set after rollout by the reference-rewards stage (0 in the pool);
    ``correct``: agreement with the gold answer (``gold_verifier``)."""
    return placeholder(task, completion)


@dataclass(frozen=True)
class ReferenceTerm:
    """A reward term the reference-rewards stage scores: its name, verifier, weight and validated settings."""

    name: str
    verifier: str
    weight: float
    settings: ReferenceSettings


def reference_terms(reward: Any, task_verifier: str) -> list[ReferenceTerm]:
    """The run's reward terms whose verifier declares ``reference_logp`` (``reward.terms``; without terms,
    ``task.verifier`` alone as one term of weight 1 with the default options), each term's ``params``
    validated as its verifier's settings (a ``ConfigError`` naming the term)."""
    found = ([(f"reward.terms.{i}.params", t.name, t.verifier, t.weight, t.params)
              for i, t in enumerate(reward.terms) if t.verifier is not None] if reward.terms
             else [("task.verifier", task_verifier, task_verifier, 1.0, {})])
    return [ReferenceTerm(name, verifier, weight, VERIFIERS.entry(verifier).make_settings(params, where))
            for where, name, verifier, weight, params in found
            if verifier in VERIFIERS and REFERENCE_LOGP in VERIFIERS.needs(verifier)]


def reasoning_of(completion: str, number_fallback: bool = True) -> str:
    """The completion's text before its answer (``answer_start``); all of it when it has no answer."""
    start = answer_start(completion, number_fallback)
    return completion if start is None else completion[:start]


# ----------------------------------------------------------------------------------------------
# RLPR


def rlpr_reward(logp: Sequence[float], base_logp: Sequence[float] | None) -> float:
    """``clip(mean_j exp(logp_j) - mean_j exp(base_logp_j), 0, 1)``: the mean of the reference tokens'
    probabilities (not of their log-probabilities) after the reasoning, less the same without it (None:
    not debiased); 0 for an empty reference."""
    if not logp:
        return 0.0
    r = mean_prob(logp) - (mean_prob(base_logp) if base_logp is not None else 0.0)
    return min(max(r, 0.0), 1.0)


def mean_prob(logp: Sequence[float]) -> float:
    """The mean of ``exp(logp_j)`` (0 for none)."""
    return sum(math.exp(x) for x in logp) / len(logp) if logp else 0.0


class StdThreshold:
    """RLPR's adaptive std filter: each step, a group whose rewards' sample std is below ``beta`` x the EMA
    of the earlier steps' mean group std is dropped (after ``warmup`` steps have entered the EMA); then
    this step's mean group std enters the EMA (initialised with the first step's). Groups of one sample
    have no std: never dropped, not averaged."""

    def __init__(self, beta: float, decay: float, warmup: int) -> None:
        self.beta, self.decay, self.warmup = beta, decay, warmup
        self.ema: float | None = None
        self.steps = 0

    def threshold(self) -> float | None:
        return self.beta * self.ema if self.ema is not None and self.steps >= self.warmup else None

    def drop(self, groups: Sequence[Sequence[float]]) -> list[bool]:
        """Which groups (each its rewards) to drop this step; updates the EMA."""
        stds = [float(torch.tensor(g, dtype=torch.float64).std()) if len(g) > 1 else None for g in groups]
        limit = self.threshold()
        out = [limit is not None and s is not None and s < limit for s in stds]
        seen = [s for s in stds if s is not None]
        if seen:
            mean = sum(seen) / len(seen)
            self.ema = mean if self.ema is None else self.decay * self.ema + (1 - self.decay) * mean
            self.steps += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema, self.steps = state.get("ema"), int(state.get("steps", 0))


# ----------------------------------------------------------------------------------------------
# DRO's R3


def r3_rewards(logp: Tensor, base_logp: Tensor | None, weighting: str = "std") -> tuple[Tensor, Tensor]:
    """(R3 [G], sigma [J]) of a group's reference log-probabilities ``logp`` [G, J] (row i: after sample i's
    reasoning): ``r_i = sum_j w_j (logp_ij - base_j)``, ``sigma_j`` the population std of column j over the
    group, ``w_j = sigma_j / sum_k sigma_k`` (``uniform``, or no spread at all: ``1 / J``); ``base_logp`` [J]
    the masked-CoT baseline (None: 0)."""
    g, j = logp.shape
    if j == 0:
        return torch.zeros(g, dtype=logp.dtype), torch.zeros(0, dtype=logp.dtype)
    sigma = logp.std(0, correction=0) if g > 1 else torch.zeros(j, dtype=logp.dtype)
    total = sigma.sum()
    w = sigma / total if weighting == "std" and total > 0 else torch.full((j,), 1.0 / j, dtype=logp.dtype)
    centred = logp - base_logp if base_logp is not None else logp
    return centred @ w, sigma


def hardest_rank(ranks: Sequence[int], fraction: float) -> float:
    """Mean of the largest ``ceil(fraction * J)`` ranks of a sample's reference tokens (DRO's
    ``avg(max_rho y_j^(r))``: how hard the reference is to predict after its reasoning); 0 for none."""
    if not ranks:
        return 0.0
    k = max(1, math.ceil(fraction * len(ranks)))
    top = sorted(ranks, reverse=True)[:k]
    return sum(top) / k


def dro_drops(max_sigma: Sequence[float], hardest: Sequence[Sequence[float]], cfg: R3Settings) -> list[bool]:
    """DRO's two filters over a step's groups (per group: ``max_j sigma_j``, and each sample's
    ``hardest_rank``): a group none of whose samples has its hardest reference tokens within the top
    ``difficulty_top_k`` (beyond the model's knowledge), then the ``low_variation_drop`` fraction of the
    rest with the lowest ``max_j sigma_j`` (too easy: the reasoning does not move the reference)."""
    out = [cfg.difficulty_top_k is not None and bool(h) and min(h) > cfg.difficulty_top_k for h in hardest]
    rest = [i for i, d in enumerate(out) if not d]
    for i in sorted(rest, key=lambda i: max_sigma[i])[:int(cfg.low_variation_drop * len(rest))]:
        out[i] = True
    return out
