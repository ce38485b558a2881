"""Where a run came from: ``provenance.json`` in the run directory, one record per session (the
first start and every resume), shown by ``reinforge report``.

Each record: the package version and, when the package runs from a git checkout, its commit (and
whether the tree had uncommitted changes); Python, torch and transformers versions; the CPU, the
GPUs torch sees and the thread count; the command line, the seed, the host and the start time.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROVENANCE_FILE = "provenance.json"


def git_state(path: Path) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``path``; None outside one (or without git)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path,
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux, else ``platform.processor()``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reinforge")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _versions() -> dict[str, str | None]:
    import torch

    try:
        import transformers

        tf_version: str | None = transformers.__version__
    except ImportError:
        tf_version = None
    return {"reinforge": _package_version(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": tf_version}


def collect(seed: int, argv: list[str] | None = None) -> dict[str, Any]:
    """This session's provenance record."""
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": _versions(),
        "git": git_state(PACKAGE_DIR),
        "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "gpus": gpus, "platform": platform.platform(), "host": socket.gethostname()},
        "command": list(sys.argv if argv is None else argv),
        "seed": seed,
    }


def record(run_dir: Path, seed: int, resumed_from: int | None = None) -> dict[str, Any]:
    """Append this session's record to ``run_dir/provenance.json`` (written whole, atomically); the
    record of a resume names the step it resumed from."""
    path = Path(run_dir) / PROVENANCE_FILE
    sessions = read(run_dir)
    entry = collect(seed)
    if resumed_from is not None:
        entry["resumed_from_step"] = resumed_from
    sessions.append(entry)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"sessions": sessions}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return entry


def read(run_dir: Path) -> list[dict[str, Any]]:
    """Every session recorded for the run (empty for a run directory from before provenance)."""
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.is_file():
        return []
    try:
        return list(json.loads(path.read_text(encoding="utf-8")).get("sessions", []))
    except (json.JSONDecodeError, AttributeError):
        return []


def summary(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) rows of one record for the report."""
    v, m, git = entry.get("versions", {}), entry.get("machine", {}), entry.get("git")
    code = f"reinforge {v.get('reinforge')}"
    if git:
        code += f" at {git['commit'][:12]}{' (uncommitted changes)' if git.get('dirty') else ''}"
    gpus = ", ".join(m.get("gpus") or []) or "none"
    return [
        ("started", str(entry.get("started", "?")) + (f" (resumed from step {entry['resumed_from_step']})"
                                                      if "resumed_from_step" in entry else "")),
        ("code", code),
        ("versions", f"python {v.get('python')}, torch {v.get('torch')}, transformers {v.get('transformers')}"),
        ("machine", f"{m.get('cpu')} ({m.get('cpu_count')} CPUs, {m.get('torch_threads')} torch threads), "
                    f"GPUs: {gpus}, host {m.get('host')}"),
        ("command", " ".join(entry.get("command", []))),
        ("seed", str(entry.get("seed"))),
    ]
