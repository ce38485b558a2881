"""Private uids for sandboxed runs when the trainer is root.

Each concurrent run gets a uid of its own from ``UID_BASE .. UID_BASE + UID_SLOTS - 1`` (no
account needs to exist; the range lies above the ranges systemd and Debian hand out). Owning
a uid alone makes RLIMIT_NPROC bound exactly that run, denies it signals to any other process
(the trainer, other runs), denies it every file not readable or writable by "others", and lets
the reaper find every process of the run by uid. A slot is held with an exclusive ``flock`` on
a root-owned lock file, so runs in different trainer processes never share a uid either.
"""

from __future__ import annotations

import fcntl
import os
import random
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from reinforge.sandbox import reaper
from reinforge.sandbox.records import SandboxError

UID_BASE = 2_000_000_000
UID_SLOTS = 64
LOCK_DIR = "/run/reinforge-sandbox"

_local_lock = threading.Lock()
_local_busy: set[int] = set()
_checked: set[int] = set()  # uids already cleared of processes left by an earlier trainer


def _lock_dir() -> str:
    os.makedirs(LOCK_DIR, mode=0o755, exist_ok=True)
    st = os.lstat(LOCK_DIR)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxError(
            f"{LOCK_DIR} must be a directory owned by uid {os.geteuid()} and writable only by it; "
            "remove it and retry"
        )
    return LOCK_DIR


def _try_lock(uid: int, directory: str) -> int | None:
    fd = os.open(os.path.join(directory, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _acquire(directory: str, wait_s: float) -> tuple[int, int]:
    """(uid, lock fd) of a free slot, waiting up to ``wait_s`` for one."""
    deadline = time.monotonic() + wait_s
    while True:
        start = random.randrange(UID_SLOTS)
        for i in range(UID_SLOTS):
            uid = UID_BASE + (start + i) % UID_SLOTS
            with _local_lock:
                if uid in _local_busy:
                    continue
                _local_busy.add(uid)
            fd = _try_lock(uid, directory)
            if fd is not None:
                return uid, fd
            with _local_lock:
                _local_busy.discard(uid)
        if time.monotonic() > deadline:
            raise SandboxError(f"all {UID_SLOTS} sandbox uids stayed busy for {wait_s}s")
        time.sleep(0.01)


@contextmanager
def private_uid(wait_s: float = 60.0) -> Iterator[int]:
    """Hold a free private uid for the duration of the block. The caller kills the run's
    processes before leaving the block; if the block raises, they are killed here. The first
    time this process takes a uid, processes left on it (by a trainer that crashed) are killed."""
    uid, fd = _acquire(_lock_dir(), wait_s)
    stuck = False
    try:
        if uid not in _checked:
            reaper.kill_all(lambda: reaper.pids_of_uid(uid))
            _checked.add(uid)
        yield uid
    except BaseException:
        try:
            reaper.kill_all(lambda: reaper.pids_of_uid(uid))
        except TimeoutError as exc:
            stuck = True  # keep the slot: its processes may still run
            raise SandboxError(f"uid {uid} is retired for this trainer: {exc}") from exc
        raise
    finally:
        if not stuck:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            with _local_lock:
                _local_busy.discard(uid)
