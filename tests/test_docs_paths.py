"""Commands in the README, docs, benchmarks, examples, scripts and tests run from a fresh clone: no absolute
path of one machine (its home or work folders, its virtual environments, its run folders). ``/tmp/...``
as a scratch folder is fine (every machine has one); a virtual environment is ``.venv`` (``make install``,
``make install-vllm``, ``make install-envpool``) and a run folder ``runs/...``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "README.md", *(ROOT / d for d in ("docs", "benchmarks", "examples", "scripts", "tests"))]
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml"}
START = r"(?<![\w.~-])"  # where an absolute path starts: not inside a relative one (runs/work/...)
MACHINE_PATH = re.compile(
    START + r"/(?:work|root|home|Users|mnt)/[^\s`'\")]*"  # one machine's folders
    r"|" + START + r"/tmp/[\w.-]*venv[^\s`'\")]*"  # a virtual environment in its /tmp
    r"|(?<![\w./-])venv-[\w.-]+"  # a venv-NAME folder beside the clone (the clone's own is .venv)
)
# (file, path prefix) found on purpose
ALLOWED = {
    ("tests/test_sandbox_hostile.py", "/root/reinforge-pwned-"),  # where a sandboxed program tries to write
    ("scripts/make_rliable_reference.py", "/tmp/rliable-venv"),  # a scratch venv its command makes first
}


def _files() -> list[Path]:
    files = [p for top in SCANNED for p in ([top] if top.is_file() else sorted(top.rglob("*")))]
    return [p for p in files if p.is_file() and p.suffix in SUFFIXES and p != Path(__file__).resolve()]


def machine_paths(text: str) -> list[tuple[int, str]]:
    """(line number, path) of every machine-specific absolute path in ``text``."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in MACHINE_PATH.finditer(line)]


def test_no_command_names_a_path_of_one_machine():
    found = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        for line, hit in machine_paths(path.read_text(errors="replace")):
            if not any(rel == f and hit.startswith(p) for f, p in ALLOWED):
                found.append(f"{rel}:{line}: {hit}")
    assert found == [], "machine-specific paths (use .venv/bin/..., runs/..., a make target):\n" + "\n".join(found)


def test_the_pattern_finds_machine_paths_and_leaves_portable_ones():
    bad = ("PYTHONPATH=. /work/venv-classic/bin/python x.py", "`/root/runs/a`", "output_dir=/home/me/runs",
           "/tmp/venv-vllm/bin/python", "venv-classic/bin/python -m pytest")
    assert [len(machine_paths(line)) > 0 for line in bad] == [True] * len(bad)
    good = (".venv/bin/python scripts/run_presets.py --out runs/presets", "--out /tmp/clip-runs",
            "make install-vllm", "tmp_path / 'work' / 'x'", "runs/work/home/x", "the venv of `make install-vllm`",
            "~/work/x is yours")
    assert [machine_paths(line) for line in good] == [[]] * len(good)
