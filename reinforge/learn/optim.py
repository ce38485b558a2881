"""The policy's optimizer (AdamW) and learning-rate schedule (linear warm-up, then constant or cosine to 0)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from torch import nn


def lr_factor(step: int, cfg: Any) -> float:
    """The multiplier of ``train.lr`` after ``step`` scheduler steps: (step + 1) / warmup during the
    warm-up, then 1 (constant) or 0.5 (1 + cos(pi * progress)) (cosine over the remaining steps)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "cosine":
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return 1.0


def build_optimizer(params: list[nn.Parameter], cfg: Any) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` with the ``train`` section's settings, and its LR schedule."""
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                                  eps=getattr(cfg, "eps", 1e-8),
                                  **({"fused": True} if cfg.fused_optimizer else {}))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, cfg=cfg))
