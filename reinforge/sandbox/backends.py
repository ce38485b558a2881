"""Isolation backends: how to start the launcher for each, and what each guarantees.

- ``bubblewrap``: ``bwrap`` with new user, PID, network, IPC, UTS (and cgroup) namespaces, the
  root filesystem read-only, a private ``/tmp``, ``/var/tmp`` and ``/dev``, and only the work directory
  writable; the sandbox dies with its parent and with its PID 1.
- ``unshare``: util-linux ``unshare`` with new PID, network, IPC, UTS and mount namespaces (plus a
  user namespace when not root); the launcher is PID 1 of the new PID namespace, so every
  process of the run dies with it. In its mount namespace the launcher mounts private,
  size-limited tmpfs over the system temp dir, ``/var/tmp`` and ``/dev/shm``, binds the work dir
  back, and remounts the root filesystem read-only (where the kernel allows it: always as root)
  before it drops to the private uid; so nothing outside the work dir and the private temp dirs
  is writable.
- ``rlimits-only``: no namespaces; resource limits, a private uid when root, and a Python audit
  hook that refuses network sockets, exec and ctypes (native code can bypass it).

When the trainer is root, every backend runs the program as a private unprivileged uid (see
``identity.py``); otherwise the program runs as the trainer's own user.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.sandbox.records import Isolation, SandboxError

BACKENDS: tuple[Isolation, ...] = ("bubblewrap", "unshare", "rlimits-only")
LAUNCHER_SOURCE = (Path(__file__).parent / "launcher.py").read_text()
PATH = "/usr/local/bin:/usr/bin:/bin"

_NOTES: dict[Isolation, str] = {
    "bubblewrap": "bubblewrap namespaces (user, pid, net, ipc, uts): no network, read-only filesystem "
    "except the work dir and a private /tmp, /var/tmp and /dev/shm, all processes die with the run",
    "unshare": "unshare namespaces (pid, net, ipc, uts, mount): no network, all processes die with the run, "
    "private size-limited /tmp, /var/tmp and /dev/shm, root filesystem read-only except the work dir",
    "rlimits-only": "WEAKER: no namespaces; network, exec and ctypes are refused by a Python audit hook "
    "that native code can bypass; the filesystem is protected only by file permissions",
}


def isolation_note(backend: Isolation, uid: int | None) -> str:
    """One line: what ``backend`` guarantees when the program runs as ``uid`` (None: our own user)."""
    who = f"; runs as private uid {uid}" if uid is not None else (
        "; runs as the trainer's own user (not root), so it may write wherever the trainer may"
        if backend != "bubblewrap" else "; runs as the trainer's own user inside a user namespace"
    )
    return _NOTES[backend] + who


@dataclass(frozen=True)
class Plan:
    """Everything needed to start one sandboxed launcher."""

    prefix: list[str]  # the command that starts the launcher's argv
    popen_kwargs: dict[str, Any] = field(default_factory=dict)
    init: bool = False  # the launcher is PID 1 of a new PID namespace: it forks and reaps
    guard: bool = False  # install the audit hook (no network namespace)
    no_new_privs: bool = True  # bwrap sets it itself
    die_with_trainer: bool = False  # the launcher is the trainer's child: PR_SET_PDEATHSIG
    helper_processes: int = 0  # processes of the run's uid besides the program (for RLIMIT_NPROC)
    mounts: dict[str, Any] | None = None  # the launcher's private mounts and the uid it then drops to


def private_tmp_dirs() -> list[str]:
    """The shared temporary directories a program could write outside its work dir: the system temp
    dir, ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (those that exist, real paths, each once)."""
    import tempfile

    found: list[str] = []
    for d in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in found:
            found.append(real)
    return found


def _world_executable(path: str) -> bool:
    """``path`` and every directory above it can be used by an unrelated uid (via "other" bits)."""
    real = Path(os.path.realpath(path))
    try:
        if not (real.stat().st_mode & stat.S_IXOTH and real.stat().st_mode & stat.S_IROTH):
            return False
        return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)
    except OSError:
        return False


@functools.cache
def default_interpreter(private_uid: bool) -> str:
    """The Python that runs inside the sandbox: the trainer's own, unless a private uid cannot
    reach it (e.g. a pyenv under /root), then the system's ``python3``."""
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3", shutil.which("python3")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and (not private_uid or _world_executable(candidate)):
            return os.path.realpath(candidate)
    raise SandboxError(
        "no Python interpreter is usable by the sandbox's unprivileged uid (tried "
        f"{', '.join(c for c in candidates if c)}); install python3 system-wide or pass python=..."
    )


@functools.cache
def _bwrap_features() -> frozenset[str]:
    try:
        text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(flag for flag in ("--disable-userns", "--size") if flag in text)


def launcher_argv(python: str, config: str) -> list[str]:
    return [python, "-I", "-S", "-B", "-c", LAUNCHER_SOURCE, config]


def sandbox_env(workdir: str, tmpdir: str, marker: str) -> dict[str, str]:
    """The program's whole environment: nothing of the trainer's."""
    from reinforge.sandbox.reaper import MARKER_ENV

    return {
        "PATH": PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir, "TMPDIR": tmpdir,
        "PYTHONIOENCODING": "utf-8", MARKER_ENV: marker,
    }


def _as_uid(uid: int | None) -> dict[str, Any]:
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def plan(backend: Isolation, workdir: str, env: dict[str, str], uid: int | None, tmp_mb: int) -> Plan:
    """How to start the launcher under ``backend``, as ``uid`` (None: as ourselves)."""
    if backend == "bubblewrap":
        features = _bwrap_features()
        argv = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        if "--disable-userns" in features:
            argv.append("--disable-userns")
        # Order matters: --dev and --proc after the root bind (or they would be hidden), the
        # work dir after the /tmp tmpfs it lives under.
        argv += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        for tmpfs in ("/tmp", "/var/tmp", "/dev/shm"):  # private, and bounded in size where bwrap can
            if not os.path.isdir(tmpfs):
                continue
            argv += (["--size", str(tmp_mb << 20)] if "--size" in features else []) + ["--tmpfs", tmpfs]
        argv += ["--remount-ro", "/dev", "--bind", workdir, workdir, "--chdir", workdir, "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return Plan(argv + ["--"], _as_uid(uid), no_new_privs=False, helper_processes=1)
    if backend == "unshare":
        namespaces = ["--net", "--pid", "--ipc", "--uts", "--mount", "--propagation", "private", "--fork",
                      "--kill-child", "--mount-proc"]
        mounts = {"tmp_dirs": private_tmp_dirs(), "size_mb": tmp_mb, "workdir": workdir, "uid": uid}
        if uid is None:  # unshare itself joins the new user namespace, where RLIMIT_NPROC counts
            argv = ["unshare", "--user", "--map-root-user", *namespaces]
            return Plan(argv + ["--"], init=True, helper_processes=2, mounts=mounts)
        # The launcher mounts as root inside the namespace, then drops to ``uid``: its PID-1 init
        # stays root, so no helper process counts against the program's uid.
        return Plan(["unshare", *namespaces, "--"], init=True, helper_processes=0, mounts=mounts)
    if backend == "rlimits-only":
        return Plan([], _as_uid(uid), guard=True, die_with_trainer=True)
    raise SandboxError(f"unknown sandbox backend {backend!r}; allowed: {', '.join(BACKENDS)}")


def binary_present(backend: Isolation) -> bool:
    return backend == "rlimits-only" or shutil.which({"bubblewrap": "bwrap", "unshare": "unshare"}[backend]) is not None
