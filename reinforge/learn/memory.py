"""Peak memory of a training step: the process's peak resident set on CPU (Linux ``VmHWM``, reset
per step through ``/proc/self/clear_refs``), the allocator's peak on CUDA."""

from __future__ import annotations

from pathlib import Path

import torch

_STATUS, _CLEAR = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def reset_peak(device: str | torch.device = "cpu") -> bool:
    """Start a new peak window; False where the OS does not allow it (the peak is then since start)."""
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        _CLEAR.write_text("5")  # Linux >= 4.0: reset the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def peak_mb(device: str | torch.device = "cpu") -> float | None:
    """Peak memory in MiB since the last ``reset_peak`` (CUDA: allocated tensors; CPU: the whole
    process's resident set, Python and libraries included); None where unknown."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
