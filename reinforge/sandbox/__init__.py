"""A sandbox for model-written code: `run_python` runs it under resource limits, without
network, in a fresh directory, and reports what happened. Guarantees: docs/sandbox.md."""

from reinforge.sandbox.backends import BACKENDS
from reinforge.sandbox.detect import available_backends, best_backend, run_python
from reinforge.sandbox.records import Isolation, SandboxError, SandboxLimits, SandboxResult, Status

__all__ = [
    "BACKENDS",
    "Isolation",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "Status",
    "available_backends",
    "best_backend",
    "run_python",
]
