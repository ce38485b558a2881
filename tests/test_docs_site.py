"""The documentation site (mkdocs.yml, `make docs`): the generated reference in docs/reference/ is what
scripts/gen_reference.py writes from the registries now, the site builds with ``mkdocs build --strict``
(no broken link or anchor, no page outside the navigation) within a minute, and headless Chromium shows
its home page and a reference page with their title, navigation and a formula."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from headless_browser import dump_dom, find_browser

ROOT = Path(__file__).resolve().parents[1]
BUILD_SECONDS = 60


def test_generated_reference_is_current():
    # a process of its own: parts the other tests register (plug-ins) are not the package's
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, "docs/reference/ is stale:\n" + out.stderr[-3000:]


def test_every_doc_page_is_in_the_navigation():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(node) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for v in node.values() for p in pages(v)]
        return [p for v in node for p in pages(v)]

    listed = pages(nav)
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(set(listed)) == on_disk
    assert len(listed) == len(set(listed)), "a page is listed twice"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material not installed: pip install -e '.[docs]' (make docs installs them)")
    out_dir = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out_dir)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    seconds = time.perf_counter() - start
    assert out.returncode == 0, out.stderr[-4000:]
    assert seconds < BUILD_SECONDS, f"mkdocs build took {seconds:.1f} s"
    return out_dir


def test_site_builds_strictly(site):
    assert (site / "index.html").is_file()
    assert (site / "reference" / "advantage.html").is_file()
    assert (site / "search" / "search_index.json").is_file()


@pytest.fixture(scope="module")
def browser() -> str:
    return find_browser("the site's rendering test needs it")


def _dom(browser: str, page: Path, profile: Path) -> str:
    """The page's DOM after load, as headless Chromium renders it."""
    return dump_dom(browser, page, profile, window="1280,900")


def test_chromium_shows_home_and_reference_pages(site, browser, tmp_path):
    from reinforge.parts import all_kinds

    home = _dom(browser, site / "index.html", tmp_path / "profile")
    assert re.search(r"<title>Home - reinforge</title>", home)
    assert 'class="md-tabs' in home and 'class="md-nav' in home  # the navigation tabs and side bar
    assert "algorithms.html" in home and "reference/index.html" in home

    grpo = all_kinds()["advantage"].entry("grpo")
    ref = _dom(browser, site / "reference" / "advantage.html", tmp_path / "profile2")
    assert re.search(r"<title>\s*Advantage estimators", ref)
    assert 'class="md-nav' in ref and 'id="grpo"' in ref
    formula = grpo.formula.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"<code>{formula}</code>" in ref
