"""Per-step peak memory: the peak window resets and sees a large allocation."""

import sys

import pytest
import torch

from reinforge.train.memory import peak_mb, reset_peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux")
def test_peak_rss_window_sees_an_allocation_and_resets():
    assert reset_peak()
    base = peak_mb()
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    big += 1
    high = peak_mb()
    del big
    assert high is not None and base is not None and high - base > 50
    reset_peak()
    assert peak_mb() < high - 50  # the new window starts at the current (smaller) resident set
