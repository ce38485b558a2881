"""Losses that train reward models: outcome reward models on preference pairs, process reward models
on step labels. Pure tensor maths; ``reinforge.rm`` feeds them.

| name | formula | paper |
|---|---|---|
| ``bradley_terry`` | ``-log sigmoid(r_w - r_l - m) + eta (r_w + r_l)^2`` | Bradley & Terry 1952; margin: Touvron et al. 2023 (Llama 2); centering: Eisenstein et al. 2023 |
| ``prm_step_bce`` | ``-[y_i log sigmoid(s_i) + (1 - y_i) log(1 - sigmoid(s_i))]`` at each step's last token | Wang et al. 2024 (Math-Shepherd) |

Scores may carry a last axis of ``k`` ensemble heads: each head is trained on the same pairs and the
loss is the mean over heads (Coste et al. 2024, "Reward Model Ensembles Help Mitigate Overoptimization").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from reinforge.registry import Registry, Settings, kind

RM_LOSSES: Registry = kind("rm_loss", Registry("reward-model loss", inputs=frozenset({"chosen", "rejected", "margin", "cfg"})))


class BradleyTerrySettings(Settings):
    margin: bool = Field(False, description="subtract each pair's margin column m from the score gap (Llama 2's "
                         "margin loss); pairs without one use 0")
    center_coef: float = Field(0.0, ge=0.0, description="eta of the centering term eta * (r_w + r_l)^2, which pins "
                               "the scores' mean near 0 (Eisenstein et al. 2023)")


@RM_LOSSES.register(
    "bradley_terry",
    formula="mean over pairs and heads of -log sigmoid(r_w - r_l - m) + eta * (r_w + r_l)^2",
    paper="Bradley & Terry 1952; InstructGPT's reward model, Ouyang et al. 2022 (arXiv:2203.02155); margin m: "
          "Touvron et al. 2023, Llama 2 (arXiv:2307.09288); centering eta: Eisenstein et al. 2023, Helping or "
          "Herding? (arXiv:2312.09244)",
    settings=BradleyTerrySettings,
)
def bradley_terry(chosen: Tensor, rejected: Tensor, margin: Tensor | None, cfg: BradleyTerrySettings
                  ) -> tuple[Tensor, dict[str, Tensor]]:
    """``chosen``, ``rejected``: scores ``[pairs]`` or ``[pairs, heads]``; ``margin``: ``[pairs]`` (used
    with ``cfg.margin``). Returns the loss and detached metrics: ``accuracy`` (r_w > r_l; a tie
    counts half), ``gap`` (mean r_w - r_l), ``mean_score``."""
    gap = chosen - rejected
    if cfg.margin and margin is not None:
        gap = gap - (margin if gap.dim() == 1 else margin[:, None])
    loss = -F.logsigmoid(gap).mean()
    if cfg.center_coef:
        loss = loss + cfg.center_coef * ((chosen + rejected) ** 2).mean()
    raw_gap = (chosen - rejected).detach()
    metrics = {"accuracy": ((raw_gap > 0).float() + 0.5 * (raw_gap == 0).float()).mean(),
               "gap": raw_gap.mean(), "mean_score": (chosen + rejected).detach().mean() / 2}
    return loss, metrics


PRM_LOSSES: Registry = kind("prm_loss", Registry("process-reward-model loss",
                                                 inputs=frozenset({"step_scores", "labels", "mask", "cfg"})))


@PRM_LOSSES.register(
    "prm_step_bce",
    formula="mean over labelled steps of -[y_i log sigmoid(s_i) + (1 - y_i) log(1 - sigmoid(s_i))]",
    paper="Wang et al. 2024, Math-Shepherd (arXiv:2312.08935); Lightman et al. 2023, Let's Verify Step by Step "
          "(arXiv:2305.20050)",
)
def prm_step_bce(step_scores: Tensor, labels: Tensor, mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Math-Shepherd's process reward loss (Wang et al. 2024, arXiv:2312.08935, eq. 3): binary cross
    entropy of each step's score (a logit at the step's last token) against its label ``y_i`` in [0, 1]
    (hard: 1 if some continuation from the step reaches the right answer; soft: the fraction that do),
    averaged over the labelled steps (``mask``). Metric ``step_accuracy``: ``(s_i > 0) == (y_i >= 0.5)``."""
    mask = mask.to(step_scores.dtype)
    steps = mask.sum().clamp(min=1)
    per_step = F.binary_cross_entropy_with_logits(step_scores, labels.to(step_scores.dtype), reduction="none")
    right = ((step_scores > 0) == (labels >= 0.5)).to(step_scores.dtype)
    return (per_step * mask).sum() / steps, {"step_accuracy": ((right * mask).sum() / steps).detach()}


def pair_accuracy(chosen: Tensor, rejected: Tensor) -> Tensor:
    """Per pair: 1 if r_w > r_l, 1/2 on a tie, else 0 (scores of one head, ``[pairs]``)."""
    gap = chosen - rejected
    return (gap > 0).to(torch.float64) + 0.5 * (gap == 0).to(torch.float64)
