"""MRT's progress reward (Qu et al. 2025, "Optimizing Test-Time Compute via Meta Reinforcement Fine-Tuning",
arXiv:2503.07572): the output stream is a sequence of episodes, and each episode is credited with the
change it makes in the likelihood of success of a *meta-prover* mu that stops thinking and answers:

    progress_{i,s} = J_{i,s} - J_{i,s-1},  J_{i,s} = r(mu(. | x, z_{0:s}))  (J_{i,-1} = 0)
    A_{i,t} = (r_i - mean_g r) / (std_g r + eps) + alpha * progress_{i,s(t)}

The episodes are the stretches between the estimator's ``budgets`` (token cuts; a first budget of 0 scores
the prompt alone, J(mu(. | x)), so the first episode's progress is measured from answering at once), and
J_{i,s} is the score of the answer at cut s: the budget-scores stage (orchestrate/budget_scores.py) reads
it off the cut itself or samples one forced answer (the meta-prover: the policy after ``summary_suffix``)
per cut, the same stage as AnytimeReasoner's ``brpo``. s(t) is the episode of token t (algo/brpo.py,
``per_token``); the outcome term is GRPO's (std scaling optional).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, group_relative
from reinforge.algo.brpo import FIELD, BudgetCutSettings, per_token
from reinforge.algo.returns import _per_token

PAPER = ("Qu et al. 2025, Optimizing Test-Time Compute via Meta Reinforcement Fine-Tuning (MRT, arXiv:2503.07572), "
         "the progress bonus per episode")


class MRTSettings(BudgetCutSettings):
    budgets: list[float] = Field([0.0, 0.25, 0.5, 0.75, 1.0], min_length=1, description="the episode boundaries as "
                                 "fractions of rollout.max_new_tokens, increasing; 0: the prompt alone")
    alpha: float = Field(1.0, ge=0, description="weight of the progress bonus")
    scale_by_std: bool = Field(True, description="divide the outcome term by the group's std")
    adv_eps: float = Field(1e-6, gt=0, description="epsilon added to the std")
    gamma: float = Field(1.0, ge=0, le=1, description="discount of per-token rewards (token_rewards), as grpo's")


def progress(scores: Tensor) -> Tensor:
    """[N, S]: J_{i,s} - J_{i,s-1}, with J_{i,-1} = 0."""
    j = scores.to(torch.float64)
    return j - torch.cat([torch.zeros_like(j[:, :1]), j[:, :-1]], 1)


@ADVANTAGES.register(
    "mrt",
    formula="A_{i,t} = (r_i - mean_g(r)) / (std_g(r) + eps) + alpha * (J_{i,s(t)} - J_{i,s(t)-1}), J_{i,s} = the score "
            "of the answer forced at cut s (J_{i,-1} = 0), s(t): the episode of token t  [std scaling optional]",
    paper=PAPER,
    settings=MRTSettings,
    needs=(FIELD,),
)
def mrt_advantage(rewards: Tensor, group_index: Tensor, mask: Tensor, cfg: MRTSettings,
                  budget_scores: Tensor | None = None, budget_ends: Tensor | None = None,
                  token_rewards: Tensor | None = None) -> Tensor:
    """GRPO's outcome advantage plus MRT's dense progress bonus on each episode's tokens (module docstring).
    Without ``budget_scores`` the bonus is 0 (grpo)."""
    outcome = _per_token(group_relative(rewards.to(torch.float64), group_index, cfg), mask, token_rewards, cfg)
    if budget_scores is None or budget_ends is None or cfg.alpha == 0:
        return outcome
    bonus = per_token(cfg.alpha * progress(budget_scores), budget_ends, mask)
    return outcome + bonus
