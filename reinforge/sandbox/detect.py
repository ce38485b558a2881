"""Which isolation backends work on this machine, found by running a probe program in each, and
``run_python`` in the strongest of them."""

from __future__ import annotations

import functools
import logging
import threading

from reinforge.sandbox.backends import BACKENDS, binary_present
from reinforge.sandbox.records import Isolation, SandboxError, SandboxLimits, SandboxResult
from reinforge.sandbox.runner import run_python_in

log = logging.getLogger(__name__)
_PROBE = "import sys; print(sys.version_info[0])"
_lock = threading.Lock()


@functools.cache
def _works(backend: Isolation) -> bool:
    if not binary_present(backend):
        return False
    try:
        result = run_python_in(backend, _PROBE, limits=SandboxLimits(timeout_s=30.0))
    except SandboxError as exc:
        log.warning("sandbox backend %s is installed but does not work here: %s", backend, exc)
        return False
    if not result.ok or result.stdout.strip() != "3":
        log.warning("sandbox backend %s is installed but fails its probe: %s %s", backend, result.reason, result.stderr[-500:])
        return False
    return True


def available_backends() -> list[Isolation]:
    """The backends that run a probe program here, strongest first (probed once per process)."""
    with _lock:
        return [b for b in BACKENDS if _works(b)]


def best_backend() -> Isolation:
    """The strongest working backend; logs a warning once when only the weak fallback works."""
    backends = available_backends()
    if not backends:
        raise SandboxError("no sandbox backend works here, not even rlimits-only; see the log for the probes' errors")
    if backends[0] == "rlimits-only":
        _warn_weak()
    return backends[0]


@functools.cache
def _warn_weak() -> None:
    log.warning(
        "sandbox: neither bubblewrap nor unshare works here; falling back to rlimits-only, whose network "
        "and exec blocking is a Python audit hook that native code can bypass (see docs/sandbox.md)"
    )


def run_python(
    code: str,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    *,
    backend: Isolation | None = None,
    python: str | None = None,
) -> SandboxResult:
    """``runner.run_python_in`` with ``backend`` defaulting to the strongest one that works here
    (``best_backend()``): run ``code`` as ``main.py`` with ``stdin`` and ``files`` beside it under
    ``limits``; never raises for anything the code does, raises ``SandboxError`` when the sandbox
    itself cannot run."""
    return run_python_in(backend or best_backend(), code, stdin, limits, files, python=python)
