"""The precision that log-softmax, norms and losses are computed in."""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for a model in float32, bf16 or fp16 (softmax, norms and losses are upcast); float64 for
    a model in float64, the exact-arithmetic reference of the tests (tests/numerics.py)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def at_least_float32(x: Tensor) -> Tensor:
    """``x`` in ``compute_dtype(x.dtype)``."""
    return x.to(compute_dtype(x.dtype))
