"""How a step's RL loss and its demonstration terms are weighed (``algo.mixing``):

    L = w_rl(step) * L_rl + w_demo(step) * L_demo

``L_rl`` is the policy loss and the terms over the sampled rows (KL, entropy, ...), ``L_demo`` the
terms that train on demonstrations (``nll``, ``nll_phi``). A ``MIXING`` entry maps the update's
step (1-based) and its settings to ``(w_rl, w_demo)``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, model_validator

from reinforge.registry import Registry, Settings, kind

MIXING: Registry = kind("mixing", Registry("mixing"))


@MIXING.register(
    "sum",
    formula="L = L_rl + L_demo",
    paper="the plain sum: SFT alone, or a supervised term added with its own coefficient (e.g. Ouyang et al. 2022, "
          "InstructGPT's pretraining-mix term, arXiv:2203.02155)",
)
def sum_mixing(step: int, cfg: Any) -> tuple[float, float]:
    """Both parts at weight 1 (each term keeps its ``coef``)."""
    return 1.0, 1.0


class ConvexSettings(Settings):
    mu: float = Field(0.1, ge=0, le=1, description="weight of the demonstration terms; the RL loss gets 1 - mu")


@MIXING.register(
    "convex",
    formula="L = (1 - mu) L_rl + mu L_demo",
    paper="Zhang et al. 2025, CHORD with a fixed mu (CHORD-phi) (arXiv:2508.11408)",
    settings=ConvexSettings,
)
def convex_mixing(step: int, cfg: ConvexSettings) -> tuple[float, float]:
    """A fixed convex combination."""
    return 1.0 - cfg.mu, cfg.mu


class ChordSettings(Settings):
    mu_peak: float = Field(0.9, ge=0, le=1, description="mu after the warm-up")
    mu_valley: float = Field(0.05, ge=0, le=1, description="mu after the decay, to the end of the run")
    warmup_steps: int = Field(0, ge=0, description="steps over which mu rises linearly from 0 to mu_peak")
    decay_steps: int = Field(200, ge=1, description="steps over which mu falls from mu_peak to mu_valley (cosine)")

    @model_validator(mode="after")
    def _valley_below_peak(self) -> ChordSettings:
        if self.mu_valley > self.mu_peak:
            raise ValueError(f"mu_valley ({self.mu_valley}) must not exceed mu_peak ({self.mu_peak})")
        return self


def chord_mu(step: int, cfg: ChordSettings) -> float:
    """mu at update ``step`` (1-based; the schedule's own clock is step - 1, from 0):
    s < W: mu_peak * s / W;  W <= s < W + D: mu_valley + (mu_peak - mu_valley) * (1 + cos(pi (s - W) / D)) / 2;
    then mu_valley."""
    s, w, d = step - 1, cfg.warmup_steps, cfg.decay_steps
    if s < w:
        return cfg.mu_peak * s / w
    if s >= w + d:
        return cfg.mu_valley
    return cfg.mu_valley + (cfg.mu_peak - cfg.mu_valley) * 0.5 * (1 + math.cos(math.pi * (s - w) / d))


@MIXING.register(
    "chord",
    formula="L = (1 - mu_s) L_rl + mu_s L_demo, mu_s: linear warm-up to mu_peak, cosine decay to mu_valley",
    paper="Zhang et al. 2025, CHORD-mu, On-Policy RL Meets Off-Policy Experts (arXiv:2508.11408)",
    settings=ChordSettings,
)
def chord_mixing(step: int, cfg: ChordSettings) -> tuple[float, float]:
    """CHORD's global coefficient: expert imitation first, on-policy exploration later (the schedule's
    shape is the paper's: warm-up, cosine decay, a floor). Its values are this project's choice, not
    taken from the paper: mu_peak 0.9, mu_valley 0.05, no warm-up, 200 decay steps; set them per run."""
    mu = chord_mu(step, cfg)
    return 1.0 - mu, mu
