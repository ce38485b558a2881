"""Your own reward function, named in a recipe: ``task.verifier: my_rewards.py:score`` (a Python file)
or ``task.verifier: mypkg.rewards:score`` (an importable module), and the same for a reward term's
``verifier``. No registration and no Python driver script are needed.

The function takes ``(task, completion)`` (a ``reinforge.types.Task`` and the completion text)
and returns a ``RewardResult`` or a number (a bool counts as 0/1; ``correct`` is then
``reward >= 1``). It is imported once when the config is checked (so a typo fails before any model
loads), and again in each process that scores: ``ImportedVerifier`` pickles as its reference
alone, so thread and process reward pools and asynchronous rollout workers all import the same
function themselves. A file path is made absolute when the config is checked; a module name is
imported as is, with the working directory on the path as ``python -m`` would have it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.plugins import import_callable
from reinforge.rewards.verifiers import VERIFIERS, RewardResult, Verifier
from reinforge.types import Task

_LOADED: dict[str, Any] = {}  # reference -> function, per process


class VerifierReferenceError(ValueError):
    """A ``module:function`` / ``file.py:function`` reference that does not name a callable."""


def is_reference(name: str) -> bool:
    """``module:function`` or ``file.py:function`` rather than a registered verifier's name."""
    return ":" in name


def normalise_reference(reference: str) -> str:
    """The reference with a relative file path made absolute; checks that it imports to a callable
    (``VerifierReferenceError``, a ``ValueError``, saying what is wrong otherwise)."""
    target, _, attr = reference.rpartition(":")
    if not target or not attr:
        raise VerifierReferenceError(f"verifier {reference!r}: expected module:function or path/to/file.py:function")
    if target.endswith(".py"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise VerifierReferenceError(f"verifier {reference!r}: no such file {str(path.absolute())!r}")
        reference = f"{os.path.normpath(path.absolute())}:{attr}"
    load_reference(reference)
    return reference


def load_reference(reference: str) -> Any:
    """The callable a reference names (cached per process); ``VerifierReferenceError`` if it does not import."""
    if reference in _LOADED:
        return _LOADED[reference]
    obj = import_callable(reference, "verifier", VerifierReferenceError, module_label="verifier")
    _LOADED[reference] = obj
    return obj


@dataclass(frozen=True)
class ImportedVerifier:
    """A verifier given as ``module:function`` / ``file.py:function``; pickles as the reference."""

    reference: str

    def __call__(self, task: Task, completion: str) -> RewardResult:
        value = load_reference(self.reference)(task, completion)
        if isinstance(value, RewardResult):
            return value
        if isinstance(value, bool | int | float) and math.isfinite(float(value)):
            return RewardResult(float(value), float(value) >= 1.0)
        raise TypeError(f"verifier {self.reference!r} returned {value!r}: expected a RewardResult or a finite number")


def resolve_verifier(name: str) -> Verifier:
    """A registered verifier by name, or an ``ImportedVerifier`` for a ``module:function`` reference."""
    return ImportedVerifier(name) if is_reference(name) else VERIFIERS.get(name)
