"""How a reward model's score becomes the reward the policy trains on (reward shaping against reward hacking).

| name | formula | paper |
|---|---|---|
| ``none`` | ``R = r`` | |
| ``clip`` | ``R = clip(r, mu - c sigma, mu + c sigma)``, ``mu``, ``sigma``: running mean and std of every raw score | Fu et al. 2025 (the Clip baseline) |
| ``par`` | ``R = 1/M sum_m sigmoid(k (r - r_ref_m))`` over the prompt's M reference rewards | Fu et al. 2025 (Preference As Reward) |

Fu et al. 2025, "Reward Shaping to Mitigate Reward Hacking in RLHF" (arXiv:2502.18770): an RL reward should
be bounded and centred on a reference; PAR is the reward model's own Bradley-Terry preference of the
response over the reference responses. ``r_ref_m`` is the reward model's score of the prompt's m-th
reference response (the reward term supplies them: rewards/reward_model.py).

Inputs (bound by name): ``scores`` [N] (the raw, aggregated scores), ``reference`` [N, M] (reference
rewards, NaN where a prompt has fewer than M), ``mean`` and ``std`` (floats: the running statistics of
the raw scores, this call's included); ``cfg`` the settings.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.registry import Registry, Settings, kind

RM_TRANSFORMS: Registry = kind("rm_transform", Registry(
    "reward-model score transform", inputs=frozenset({"scores", "reference", "mean", "std", "cfg"})))
_PAPER = "Fu et al. 2025, Reward Shaping to Mitigate Reward Hacking in RLHF (arXiv:2502.18770)"


@RM_TRANSFORMS.register("none", formula="R = r", paper=_PAPER + ": the unshaped baseline")
def no_transform(scores: Tensor) -> Tensor:
    """The score as it is."""
    return scores


class ClipSettings(Settings):
    width: float = Field(1.0, gt=0.0, description="c: the clip range is mean +- c running standard deviations")


@RM_TRANSFORMS.register("clip", formula="R = clip(r, mu - c sigma, mu + c sigma) (running mu, sigma of raw scores)",
                        paper=_PAPER, settings=ClipSettings)
def clip_transform(scores: Tensor, mean: float, std: float, cfg: ClipSettings) -> Tensor:
    """The score held within ``c`` running standard deviations of the running mean: the policy gains
    nothing from pushing a score past what the reward model usually gives."""
    return scores.clamp(mean - cfg.width * std, mean + cfg.width * std)


class PARSettings(Settings):
    k: float = Field(1.0, gt=0.0, description="the sigmoid's slope (the paper's sigmoid_k; 1 is its default)")


@RM_TRANSFORMS.register("par", formula="R = 1/M sum_m sigmoid(k (r - r_ref_m))", paper=_PAPER, settings=PARSettings)
def par_transform(scores: Tensor, reference: Tensor, cfg: PARSettings) -> Tensor:
    """The reward model's preference for the response over each of its prompt's reference responses,
    averaged (NaN references, where a prompt has fewer, are left out): bounded in (0, 1), 1/2 at the
    reference, steep near it and flat far above it."""
    wins = torch.sigmoid(cfg.k * (scores.unsqueeze(-1) - reference))
    return torch.nanmean(wins, dim=-1)
