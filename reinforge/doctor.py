"""`reinforge doctor`: what this machine gives reinforge: versions, CPU and threads, GPUs, and which
code sandbox backend runs untrusted code here and what it guarantees."""

from __future__ import annotations

import os

from reinforge.sandbox.backends import BACKENDS, binary_present, isolation_note
from reinforge.sandbox.detect import available_backends


def sandbox_lines() -> list[str]:
    """One line per sandbox backend (works here, or why not), then the one in use and its guarantee."""
    working = available_backends()
    uid = "a private unprivileged uid" if os.geteuid() == 0 else None
    lines = []
    for backend in BACKENDS:
        if backend in working:
            state = "works"
        elif not binary_present(backend):
            state = "not installed" + (" (apt-get install bubblewrap)" if backend == "bubblewrap" else "")
        else:
            state = "installed but fails its probe (see the log)"
        lines.append(f"  {backend:<13} {state}")
    if not working:
        lines.append("in use: none: untrusted code cannot run here")
        return lines
    note = isolation_note(working[0], None)
    if uid is not None:
        note = note.split("; runs as")[0] + f"; runs as {uid}"
    lines.append(f"in use: {working[0]}: {note}")
    return lines


def report() -> str:
    """The whole `reinforge doctor` text."""
    from reinforge.track.provenance import collect

    p = collect(seed=0)
    v, m = p["versions"], p["machine"]
    git = p["git"]
    lines = [
        f"reinforge {v['reinforge']}" + (f" at {git['commit'][:12]}{' (uncommitted changes)' if git['dirty'] else ''}"
                                         if git else ""),
        f"python {v['python']}, torch {v['torch']}, transformers {v['transformers']}",
        f"CPU: {m['cpu']} ({m['cpu_count']} CPUs, torch uses {m['torch_threads']} threads)",
        f"GPUs: {', '.join(m['gpus']) or 'none (CPU only)'}",
        "code sandbox backends (strongest first):",
        *sandbox_lines(),
    ]
    return "\n".join(lines)
