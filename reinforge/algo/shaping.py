"""Reward shaping terms computed from rollout statistics."""

from __future__ import annotations

import torch
from torch import Tensor


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
