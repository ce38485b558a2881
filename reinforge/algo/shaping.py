"""Reward shapers: per-sequence changes to the rewards (and to which sequences train) computed from
rollout statistics, after scoring and before advantages (registered in ``REWARD_SHAPERS``).

A shaper's parameters name fields of ``ShapeInputs`` (bound by ``Registry.call``); ``cfg`` is its
settings. It returns a ``Shaping``: ``reward`` [N] is added to the rewards, ``trainable`` [N] (bool)
is and-ed into which sequences get a loss. Recipes list them in ``algo.reward_shapers`` and they
apply in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from reinforge.registry import Registry, kind


@dataclass(frozen=True)
class ShapeInputs:
    """Per sequence of a rollout batch: ``rewards`` [N] (float64), ``lengths`` [N] (generated tokens),
    ``truncated`` [N] (bool: stopped by a length limit), ``group_index`` [N]; the batch's
    ``max_new_tokens``; ``correct`` [N] (bool: the verifier's verdict, ``Trajectory.metadata['correct']``;
    None: not known, and a shaper that needs it reads ``rewards > 0``); ``tool_calls`` [N] (long: the tool
    calls the episode made, ``Trajectory.metadata['tool_calls']``, 0 where the environment counts none);
    ``texts`` (the completions' texts, one per sequence; None: not known)."""

    rewards: Tensor
    lengths: Tensor
    truncated: Tensor
    group_index: Tensor
    max_new_tokens: int
    correct: Tensor | None = None
    tool_calls: Tensor | None = None
    texts: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Shaping:
    reward: Tensor | None = None  # [N], added to the rewards
    trainable: Tensor | None = None  # [N] bool, and-ed into Trajectory.trainable


REWARD_SHAPERS: Registry = kind("reward_shaper", Registry("reward shaper"))


def soft_overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), to add to the reward.

    With L the number of generated tokens, L_max = ``max_len`` and L_cache = ``buffer``:
    R(L) = 0                                      if L <= L_max - L_cache
         = factor * ((L_max - L_cache) - L) / L_cache   if L_max - L_cache < L <= L_max
         = -factor                                if L > L_max
    i.e. the penalty ramps linearly from 0 to -factor over the last ``buffer`` tokens before the
    limit. ``buffer = 0`` disables it (all zeros). Returns ``lengths.dtype`` if floating, else the
    default float dtype.
    """
    if buffer < 0:
        raise ValueError(f"overlong buffer must be >= 0, got {buffer}")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    if buffer == 0:
        return torch.zeros(lengths.shape, dtype=dtype, device=lengths.device)
    length = lengths.to(torch.float64)
    start = float(max_len - buffer)
    ramp = factor * (start - length) / buffer
    out = torch.where(length <= start, torch.zeros_like(length), ramp)
    out = torch.where(length > max_len, torch.full_like(length, -factor), out)
    return out.to(dtype)


class OverlongPenaltySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    buffer: float = Field(0.2, gt=0, lt=1, description="L_cache as a fraction of max_new_tokens (DAPO: 4096/20480)")
    penalty: float = Field(1.0, ge=0, description="the penalty at and beyond max_new_tokens")


@REWARD_SHAPERS.register(
    "overlong_penalty",
    formula="r_i += R(L_i): 0 if L <= L_max - L_cache; ((L_max - L_cache) - L) / L_cache * c if L <= L_max; -c beyond",
    paper="Yu et al. 2025, DAPO soft overlong punishment (arXiv:2503.14476, eq. 13)",
    settings=OverlongPenaltySettings,
)
def overlong_penalty(lengths: Tensor, max_new_tokens: int, cfg: OverlongPenaltySettings) -> Shaping:
    """DAPO's soft overlong punishment with L_max = ``max_new_tokens`` and L_cache =
    max(1, round(``cfg.buffer`` * L_max)), c = ``cfg.penalty``."""
    buffer = max(1, round(cfg.buffer * max_new_tokens))
    return Shaping(reward=soft_overlong_penalty(lengths, max_new_tokens, buffer, cfg.penalty))


@REWARD_SHAPERS.register(
    "overlong_filter",
    formula="no loss on sequence i if it was truncated by a length limit",
    paper="Yu et al. 2025, DAPO overlong filtering (arXiv:2503.14476, section 3.4)",
)
def overlong_filter(truncated: Tensor) -> Shaping:
    """Truncated responses are masked out of the loss (their rewards still count in the statistics)."""
    return Shaping(trainable=~truncated)
