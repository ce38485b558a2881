"""Proposer rewards for problem synthesis by self-play: the reward of the role that writes a task, from the
solver's success rate on it (docs/multi_agent.md, reinforge/envs/problem_synthesis.py).

``p`` [N] is the solver's mean success over its ``n`` samples of each proposed task (float64 in [0, 1]).

    learnability    r = 0 if p in {0, 1}, else 1 - p             Absolute Zero (Zhao et al. 2025, arXiv:2505.03335, eq. 4)
    spell_gaussian  r = exp(-(p - mu)^2 / (2 sigma^2))           SPELL (Yang et al. 2025, arXiv:2509.23863): the
                    questioner's reward peaks where the responder succeeds half the time (mu = 0.5)

Format penalties (a task that does not parse, or breaks the task family's rules) are the environment's
(Absolute Zero's -1 / -0.5), not these parts': a part is called only for a task the verifier accepted.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.registry import Registry, Settings, kind

PROPOSER_REWARDS: Registry = kind("proposer_reward", Registry("proposer reward"))


def _rates(p: Tensor) -> Tensor:
    p = p.to(torch.float64)
    if bool(((p < 0) | (p > 1) | ~torch.isfinite(p)).any()):
        raise ValueError("proposer reward: solve rates must lie in [0, 1]")
    return p


@PROPOSER_REWARDS.register("learnability", paper="Zhao et al. 2025, Absolute Zero (arXiv:2505.03335)",
                           formula="r = 0 if p in {0, 1} else 1 - p  (p: the solver's mean success over its n samples)")
def learnability(p: Tensor, cfg: object = None) -> Tensor:
    """Absolute Zero's learnability reward: a task the solver always or never solves teaches nothing (0);
    otherwise the harder (lower ``p``) the better, ``1 - p``."""
    p = _rates(p)
    return torch.where((p == 0) | (p == 1), torch.zeros_like(p), 1.0 - p)


class GaussianSettings(Settings):
    mu: float = Field(0.5, ge=0.0, le=1.0, description="the solve rate the reward peaks at")
    sigma: float = Field(0.2, gt=0.0, description="the width; our choice (the paper's value was not in the text we read)")


@PROPOSER_REWARDS.register("spell_gaussian", paper="Yang et al. 2025, SPELL (arXiv:2509.23863)", settings=GaussianSettings,
                           formula="r = exp(-(p - mu)^2 / (2 sigma^2)), mu = 0.5  (p: the solver's mean success)")
def spell_gaussian(p: Tensor, cfg: GaussianSettings | None = None) -> Tensor:
    """SPELL's questioner reward: a Gaussian of the responder's success rate centred on ``mu`` (0.5: the task
    the current solver gets right half the time scores 1; always or never solved score exp(-mu^2 / 2 sigma^2)
    and exp(-(1 - mu)^2 / 2 sigma^2), 0.044 each at sigma 0.2)."""
    cfg = cfg or GaussianSettings()
    p = _rates(p)
    return torch.exp(-((p - cfg.mu) ** 2) / (2 * cfg.sigma ** 2))
