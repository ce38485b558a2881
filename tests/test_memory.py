"""Per-step peak memory: the peak window resets and sees a large allocation."""

import mmap
import sys

import pytest

from reinforge.learn.memory import peak_mb, reset_peak


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and clear_refs are Linux")
def test_peak_rss_window_sees_an_allocation_and_resets():
    assert reset_peak()
    base = peak_mb()
    # 64 MiB of fresh anonymous pages, every page touched: resident for sure (a malloc'd tensor may
    # reuse memory the process already holds after earlier tests, and then the peak does not move)
    big = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(big), mmap.PAGESIZE):
        big[offset] = 1
    high = peak_mb()
    big.close()
    assert high is not None and base is not None and high - base > 50
    reset_peak()
    assert peak_mb() < high - 50  # the new window starts at the current (smaller) resident set
