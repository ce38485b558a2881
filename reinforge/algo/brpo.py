"""AnytimeReasoner's Budget Relative Policy Optimization (Qi et al. 2025, "Optimizing Anytime Reasoning via
Budget Relative Policy Optimization", arXiv:2505.13438): the thinking is cut at S token budgets
b_1 < ... < b_S, an answer is read at each cut and scored (r_{i,s}: dense rewards over budgets, the
stage of orchestrate/budget_scores.py), and the thinking tokens between b_{s-1} and b_s are credited
with the prior-weighted return of the budgets they reach, against BRPO's baseline:

    R_{i,s}  = sum_{k >= s} p_k r_{i,k}                               (the return from budget s on)
    V2_{i,s} = mean over i's group of R_{.,s}                          (GRPO's group baseline)
    V1_{i,s} = (sum_{k < s} 2^k r_{i,k} / sum_{k < s} 2^k) sum_{k >= s} p_k   (0 at s = 0: the row's
               own earlier budgets' scores, the later ones weighted more, times the prior mass left)
    A_{i,s}  = R_{i,s} - (s V1_{i,s} + (S - s) V2_{i,s}) / S          (s = 0, ..., S-1)

p is the budget prior (``probs``, default uniform). The formulas are the authors' code's
(``compute_cot_advantage`` in ``verl/trainer/ppo/brpo.py``: ``discount_factor = 2``, the
``variance_reduction`` modes brpo / v1only / v2only / none = ``baseline`` brpo / previous / group / none).
A token gets the advantage of its segment: the k-th generated token of row i is in segment s, the
first with k < e_{i,s} (``budget_ends``: min(b_s, the row's length)); tokens past the last cut get
the last segment's. No std scaling (the code has none).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES
from reinforge.algo.context import register_field
from reinforge.algo.groups import dense_groups, group_reduce
from reinforge.registry import Settings

FIELD, ENDS = "budget_scores", "budget_ends"
register_field(FIELD)  # both produced by orchestrate/budget_scores.py; read here by name
register_field(ENDS)
PAPER = ("Qi et al. 2025, Optimizing Anytime Reasoning via Budget Relative Policy Optimization (AnytimeReasoner, "
         "BRPO, arXiv:2505.13438; formulas from the authors' code, brpo.py compute_cot_advantage)")


class BudgetCutSettings(Settings):
    """Where the thinking is cut and how the answer at a cut is read (the budget-scores stage,
    orchestrate/budget_scores.py); shared by the estimators that declare ``budget_scores``."""

    budgets: list[float] = Field([0.25, 0.5, 0.75, 1.0], min_length=1, description="the thinking budgets b_s as "
                                 "fractions of rollout.max_new_tokens, increasing (0: the prompt alone)")
    summary_tokens: int = Field(0, ge=0, description="0: a budget's answer is read off the cut response itself; "
                                "> 0: a summary of at most this many tokens is sampled after the cut + summary_suffix")
    summary_suffix: str = Field("</think>", description="appended to a cut before its summary (summary_tokens > 0)")

    @model_validator(mode="after")
    def _increasing(self) -> BudgetCutSettings:
        steps = zip(self.budgets, self.budgets[1:], strict=False)
        if any(not 0 <= b <= 1 for b in self.budgets) or any(b <= a for a, b in steps):
            raise ValueError(f"budgets are increasing fractions of rollout.max_new_tokens in [0, 1], got {self.budgets}")
        return self


class BRPOSettings(BudgetCutSettings):
    probs: list[float] | None = Field(None, description="the budget prior p_s (default uniform; normalised)")
    baseline: Literal["brpo", "previous", "group", "none"] = Field("brpo", description="brpo: (s V1 + (S - s) V2) "
                                                                  "/ S; previous: V1; group: V2 (GRPO's); none: 0")
    discount: float = Field(2.0, gt=0, description="V1's weights discount^k on the earlier budgets' scores")

    @model_validator(mode="after")
    def _prior(self) -> BRPOSettings:
        p = self.probs
        if p is not None and (len(p) != len(self.budgets) or min(p) < 0 or sum(p) <= 0):
            raise ValueError(f"probs needs one non-negative weight per budget, not all 0, got {self.probs}")
        return self

    def prior(self) -> Tensor:
        p = torch.tensor(self.probs if self.probs is not None else [1.0] * len(self.budgets), dtype=torch.float64)
        return p / p.sum()


def budget_returns(scores: Tensor, probs: Tensor) -> Tensor:
    """R [N, S]: R_{i,s} = sum_{k >= s} p_k r_{i,k} (a reversed cumulative sum)."""
    w = scores.to(torch.float64) * probs
    return w.flip(1).cumsum(1).flip(1)


def previous_value(scores: Tensor, probs: Tensor, discount: float) -> Tensor:
    """V1 [N, S]: the discount^k-weighted mean of the row's scores at budgets k < s, times sum_{k >= s} p_k; 0 at s = 0."""
    n, s_count = scores.shape
    w = discount ** torch.arange(s_count, dtype=torch.float64)
    num = torch.cat([torch.zeros(n, 1, dtype=torch.float64), (scores.to(torch.float64) * w).cumsum(1)[:, :-1]], 1)
    den = torch.cat([torch.ones(1, dtype=torch.float64), w.cumsum(0)[:-1]])
    left = probs.flip(0).cumsum(0).flip(0)
    return num / den * left


def group_value(returns: Tensor, group_index: Tensor) -> Tensor:
    """V2 [N, S]: the mean of R_{.,s} over each row's group."""
    gid, n_groups = dense_groups(group_index)
    ones = torch.ones(gid.shape, dtype=torch.float64)
    size = group_reduce(ones, gid, n_groups, "sum")[:, None]
    cols = [group_reduce(returns[:, s], gid, n_groups, "sum") for s in range(returns.shape[1])]
    return torch.stack(cols, 1) / size


def segment_advantages(scores: Tensor, group_index: Tensor, probs: Tensor, baseline: str, discount: float) -> Tensor:
    """A [N, S] (module docstring)."""
    s_count = scores.shape[1]
    ret = budget_returns(scores, probs)
    if baseline == "none":
        return ret
    v2 = group_value(ret, group_index)
    if baseline == "group":
        return ret - v2
    v1 = previous_value(scores, probs, discount)
    if baseline == "previous":
        return ret - v1
    s = torch.arange(s_count, dtype=torch.float64)
    return ret - (s * v1 + (s_count - s) * v2) / s_count


def per_token(seg_adv: Tensor, ends: Tensor, mask: Tensor) -> Tensor:
    """[N, T]: each masked token's segment advantage; the k-th masked token of row i (k from 0) is in the first
    segment s with k < ends[i, s] (the last segment past every end); 0 off the mask."""
    k = (mask.cumsum(1) - 1).to(torch.int64)  # [N, T]
    seg = (k[:, :, None] >= ends.to(torch.int64)[:, None, :]).sum(-1).clamp(max=seg_adv.shape[1] - 1)
    out = seg_adv.gather(1, seg)
    return torch.where(mask > 0, out, torch.zeros_like(out)).to(mask.dtype)


@ADVANTAGES.register(
    "brpo",
    formula="A_t = R_{i,s(t)} - (s V1_{i,s} + (S - s) V2_{i,s}) / S; R_{i,s} = sum_{k>=s} p_k r_{i,k}, V2 = mean_g R_{.,s}, "
            "V1 = (sum_{k<s} 2^k r_{i,k} / sum_{k<s} 2^k) sum_{k>=s} p_k; s(t): the budget segment of token t",
    paper=PAPER,
    settings=BRPOSettings,
    needs=(FIELD,),
)
def brpo_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: BRPOSettings,
                   budget_scores: Tensor | None = None, budget_ends: Tensor | None = None) -> Tensor:
    """BRPO's advantage of the thinking tokens from the per-budget scores (module docstring). Without
    ``budget_scores`` (a row set the stage did not score) every budget scores the row's reward, and the
    advantage is R - V with R = r (the prior sums to 1)."""
    n, s_count = mask.shape[0], len(cfg.budgets)
    if budget_scores is None or budget_ends is None:
        budget_scores = rewards.to(torch.float64)[:, None].expand(n, s_count)
        budget_ends = torch.full((n, s_count), mask.shape[1], dtype=torch.int64)
    probs = cfg.prior()
    seg = segment_advantages(budget_scores.to(torch.float64), group_index, probs, cfg.baseline, cfg.discount)
    return per_token(seg, budget_ends, mask)
