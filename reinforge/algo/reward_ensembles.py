"""How a reward model with several scores (k heads, or k member models) turns them into one reward.

| name | formula | paper |
|---|---|---|
| ``mean`` | ``R = mean_i R_i`` | Coste et al. 2024 (mean optimisation) |
| ``min`` | ``R = min_i R_i`` | Coste et al. 2024 (worst-case optimisation, WCO) |
| ``uwo`` | ``R = mean_i R_i - lambda * Var_i(R_i)`` | Coste et al. 2024 (uncertainty-weighted optimisation, UWO) |

``scores``: ``[samples, k]``; one score (k = 1) is returned as it is by each of them.
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from reinforge.registry import Registry, Settings, kind

RM_AGGREGATES: Registry = kind("rm_aggregate", Registry("reward-model ensemble aggregate",
                                                        inputs=frozenset({"scores", "cfg"})))
_PAPER = "Coste et al. 2024, Reward Model Ensembles Help Mitigate Overoptimization (arXiv:2310.02743)"


@RM_AGGREGATES.register("mean", formula="R = mean_i R_i", paper=_PAPER)
def mean_aggregate(scores: Tensor) -> Tensor:
    """The members' mean score."""
    return scores.mean(-1)


@RM_AGGREGATES.register("min", formula="R = min_i R_i (worst-case optimisation)", paper=_PAPER)
def min_aggregate(scores: Tensor) -> Tensor:
    """The most pessimistic member's score: the policy gains only where every member agrees."""
    return scores.min(-1).values


class UWOSettings(Settings):
    coef: float = Field(0.5, ge=0.0, description="lambda, the weight of the members' variance")


@RM_AGGREGATES.register("uwo", formula="R = mean_i R_i - lambda * Var_i R_i (population variance)", paper=_PAPER,
                        settings=UWOSettings)
def uwo_aggregate(scores: Tensor, cfg: UWOSettings) -> Tensor:
    """The mean score less ``lambda`` times the members' disagreement (their variance)."""
    return scores.mean(-1) - cfg.coef * scores.var(-1, unbiased=False)
