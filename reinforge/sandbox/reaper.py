"""Find and kill the processes a sandboxed run left behind, by scanning /proc.

A process is the run's when its real, effective, saved or filesystem uid is the run's private
uid (the trainer is root: the uid is exclusive to the run while it holds it), or, when the
trainer is not root, when its environment carries the run's marker or it is in the run's
session. Zombies are ignored: they hold no resources but a PID and vanish when reaped.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

MARKER_ENV = "REINFORGE_SANDBOX_RUN"


def _pids() -> Iterator[int]:
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return ""


def _field(status: str, key: str) -> str:
    """The value of ``key`` in a /proc/<pid>/status text ("" if absent)."""
    start = status.find(f"\n{key}:")
    if start < 0:
        return ""
    end = status.find("\n", start + 1)
    return status[start + len(key) + 2 : end if end > 0 else None].strip()


def _alive(status: str) -> bool:
    return bool(status) and not _field(status, "State").startswith(("Z", "X"))


def pids_of_uid(uid: int) -> list[int]:
    """Live processes with ``uid`` as any of their real/effective/saved/filesystem uids."""
    out, wanted = [], str(uid)
    for pid in _pids():
        status = _status(pid)
        if wanted in status and wanted in _field(status, "Uid").split() and _alive(status):
            out.append(pid)
    return out


def pids_of_run(marker: str, session: int) -> list[int]:
    """Live processes (of any uid we can read) whose environment has ``MARKER_ENV=marker`` or
    whose session is ``session``; our own process is never included."""
    needle = f"{MARKER_ENV}={marker}".encode()
    out = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        if not _alive(_status(pid)):
            continue
        try:
            in_session = os.getsid(pid) == session
        except OSError:
            in_session = False
        if in_session or _environ_has(pid, needle):
            out.append(pid)
    return out


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def task_count(uid: int) -> int:
    """Processes and threads whose real uid is ``uid`` (what RLIMIT_NPROC counts)."""
    total, wanted = 0, str(uid)
    for pid in _pids():
        status = _status(pid)
        if _field(status, "Uid").split()[:1] == [wanted]:
            total += int(_field(status, "Threads") or 1)
    return total


def kill_all(find: Callable[[], list[int]], grace_s: float = 0.0, timeout_s: float = 5.0) -> int:
    """SIGKILL everything ``find`` returns until it returns nothing; the number of distinct
    processes killed. Processes that vanish by themselves within ``grace_s`` (a PID namespace
    being torn down by the kernel) are not killed or counted. Raises TimeoutError if some
    survive ``timeout_s`` (a process stuck in the kernel, which SIGKILL cannot interrupt)."""
    killed: set[int] = set()
    grace_end = time.monotonic() + grace_s
    while find() and time.monotonic() < grace_end:
        time.sleep(0.002)
    deadline = time.monotonic() + timeout_s
    while True:
        pids = find()
        if not pids:
            return len(killed)
        if time.monotonic() > deadline:
            raise TimeoutError(f"sandbox processes survived SIGKILL for {timeout_s}s: {sorted(pids)}")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.005)
