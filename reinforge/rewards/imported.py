"""Your own reward function, named in a recipe: ``task.verifier: my_rewards.py:score`` (a Python file)
or ``task.verifier: mypkg.rewards:score`` (an importable module), and the same for a reward term's
``verifier``. No registration and no Python driver script are needed.

The function takes ``(task, completion)`` (a ``reinforge.data.base.Task`` and the completion text)
and returns a ``RewardResult`` or a number (a bool counts as 0/1; ``correct`` is then
``reward >= 1``). It is imported once when the config is checked (so a typo fails before any model
loads), and again in each process that scores: ``ImportedVerifier`` pickles as its reference
alone, so thread and process reward pools and asynchronous rollout workers all import the same
function themselves. A file path is made absolute when the config is checked; a module name is
imported as is, with the working directory on the path as ``python -m`` would have it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from reinforge.data.base import Task
from reinforge.rewards.verifiers import VERIFIERS, RewardResult, Verifier

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
    target, _, attr = reference.rpartition(":")
    try:
        module = _load_file(Path(target)) if target.endswith(".py") else _import_module(target)
    except VerifierReferenceError:
        raise
    except Exception as exc:  # the user's module failed while importing: show its error
        raise VerifierReferenceError(f"verifier {reference!r}: importing {target!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise VerifierReferenceError(f"verifier {reference!r}: {target!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise VerifierReferenceError(f"verifier {reference!r}: {attr!r} is not callable (a {type(obj).__name__})")
    _LOADED[reference] = obj
    return obj


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise VerifierReferenceError(f"verifier file {str(path)!r} does not exist")
    digest = hashlib.sha1(str(path.absolute()).encode()).hexdigest()[:10]
    name = f"reinforge_user_verifier_{path.stem}_{digest}"  # importable by pickle in this process
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise VerifierReferenceError(f"verifier file {str(path)!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(name: str) -> ModuleType:
    """``importlib.import_module``, with the working directory first on the path when the top-level
    package is not found otherwise (as ``python -m`` has it; the ``reinforge`` script does not)."""
    top, cwd = name.split(".")[0], os.getcwd()
    if importlib.util.find_spec(top) is None and cwd not in sys.path:
        sys.path.insert(0, cwd)
    if importlib.util.find_spec(top) is None:
        raise VerifierReferenceError(f"verifier module {name!r} is not importable (not installed, not in {cwd})")
    return importlib.import_module(name)


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
