"""The precision that log-softmax, norms and losses are computed in, and where bf16 forwards pay off."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
from torch import Tensor

# CPU flags (Linux /proc/cpuinfo) of native bf16 arithmetic: x86 AVX512-BF16 or AMX-BF16, Arm's BF16 extension
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for a model in float32, bf16 or fp16 (softmax, norms and losses are upcast); float64 for
    a model in float64, the exact-arithmetic reference of the tests (tests/numerics.py)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def at_least_float32(x: Tensor) -> Tensor:
    """``x`` in ``compute_dtype(x.dtype)``."""
    return x.to(compute_dtype(x.dtype))


# set to 0 or 1 to override the detection (the tests set 0: their results must not depend on the CPU's flags)
CPU_BF16_ENV = "REINFORGE_CPU_BF16"


def cpu_has_bf16() -> bool:
    """Does this CPU compute bf16 natively? ``REINFORGE_CPU_BF16`` (0 or 1) when set, else its flags
    (``cpuinfo_has_bf16``)."""
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{CPU_BF16_ENV}={forced!r}: 0 or 1 (or unset: read the CPU's flags)")
    return cpuinfo_has_bf16()


@functools.cache
def cpuinfo_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does the CPU compute bf16 natively (``BF16_CPU_FLAGS`` among its flags)? False where ``cpuinfo`` cannot be
    read (e.g. macOS): there bf16 matmuls are emulated, often slower than float32."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and BF16_CPU_FLAGS & set(value.split()):
            return True
    return False


def autocast_bf16(setting: str, device: torch.device) -> bool:
    """``train.autocast``: ``bf16`` always, ``none`` never, ``auto`` where ``device`` computes bf16 natively
    (a GPU with bfloat16, a CPU with bf16 instructions)."""
    fixed = {"none": False, "bf16": True}.get(setting)
    if fixed is not None:
        return fixed
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_bf16()


def resolved_autocast(cfg) -> str:
    """The precision of a run's learner forwards, ``bf16`` or ``float32`` (``cfg``: a ``RunConfig``)."""
    return "bf16" if autocast_bf16(cfg.train.autocast, torch.device(cfg.model.resolved_device())) else "float32"
