"""The sandbox's plain records: what a run may use (`SandboxLimits`) and what it did (`SandboxResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed"]
Isolation = Literal["bubblewrap", "unshare", "rlimits-only"]


class SandboxError(RuntimeError):
    """The sandbox itself could not run the program (not the program's fault): bad limits, no
    usable interpreter, or a backend that failed to start. The message says what to fix."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one execution.

    ``timeout_s`` is wall-clock time for the whole run (the process group is killed when it
    passes); ``cpu_s`` is CPU seconds per process (RLIMIT_CPU); ``memory_mb`` is the address
    space per process (RLIMIT_AS); ``file_mb`` the largest file it may write (RLIMIT_FSIZE);
    ``open_files`` the descriptor limit (RLIMIT_NOFILE); ``processes`` how many processes and
    threads the program may have at once, itself included (RLIMIT_NPROC of the sandbox's own
    uid); ``output_bytes`` the cap on each of stdout and stderr (the run is killed past it).
    """

    timeout_s: float = 10.0
    cpu_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 16
    open_files: int = 64
    processes: int = 32
    output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise SandboxError(f"SandboxLimits.{name} must be a positive number of seconds, got {value!r}")
        for name in ("memory_mb", "file_mb", "open_files", "processes", "output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) and value > 0):
                raise SandboxError(f"SandboxLimits.{name} must be a positive integer, got {value!r}")
        if self.memory_mb < 32:
            raise SandboxError(f"SandboxLimits.memory_mb={self.memory_mb} is too small to start Python; use >= 32")
        if self.open_files < 8:
            raise SandboxError(f"SandboxLimits.open_files={self.open_files} is too small; use >= 8")


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed execution did.

    ``status``: ``ok`` (exit code 0), ``error`` (non-zero exit), ``timeout`` (wall clock or CPU
    limit), ``memory`` (address-space limit: MemoryError), ``output_limit`` (stdout/stderr cap or
    file-size limit), ``killed`` (another signal; ``signal`` names it). ``exit_code`` follows
    ``subprocess``: negative means killed by that signal. ``reason`` is one line saying why the
    run ended; ``isolation`` names the backend and ``isolation_note`` its guarantee in one line.
    ``leftover_killed`` counts processes that outlived the program and were killed afterwards.
    ``run_id`` is the value of ``REINFORGE_SANDBOX_RUN`` in the program's environment and ``uid``
    the uid it ran as (None: the trainer's own), for matching logs and processes to the run.
    """

    status: Status
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool
    wall_time_s: float
    reason: str
    isolation: Isolation
    isolation_note: str
    signal: str | None = None
    leftover_killed: int = 0
    run_id: str = ""
    uid: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"
