"""Headless Chromium for the tests that check what a page renders (the run report, the docs site)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def find_browser(why: str) -> str:
    """Chromium's path; the calling test is skipped, naming ``why`` it needs one, where it is missing."""
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.skip(f"chromium not installed: apt-get install -y chromium ({why})")


def dump_dom(browser: str, page: Path, profile: Path, window: str = "1200,3000") -> str:
    """The page's DOM after load (scripts run, images decoded) as headless Chromium renders it."""
    out = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
         f"--user-data-dir={profile}", "--virtual-time-budget=10000", f"--window-size={window}", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=90,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
