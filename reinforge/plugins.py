"""Your own code, imported by name: ``plugins: [my_pkg.parts, path/to/parts.py]`` in a recipe.

A plug-in module registers parts when it is imported (``@ADVANTAGES.register(...)``,
``@register_environment(...)``, ...), exactly as reinforge's own modules do; the recipe then names
them like built-in ones. Plug-ins are imported before the recipe is validated (so their names
check), and again in every process that builds a run's components (rollout workers, ranks), since
a spawned process starts with reinforge's own parts only. A file path is made absolute when the
config is checked; a module name is imported as is, with the working directory on the path as
``python -m`` would have it. ``import_user_module`` is also how ``module:function`` verifier
references load (rewards/imported.py).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from reinforge.errors import ConfigError


class PluginError(ConfigError, ValueError):
    """A plug-in that does not import; the message names it and the error it raised."""


def import_user_module(target: str, label: str, error: type[Exception] = PluginError) -> ModuleType:
    """The module ``target`` names: a ``.py`` file (imported under a name derived from its absolute
    path, so pickle finds its functions in this process) or a dotted module name. ``error(message)``
    is raised, naming ``label``, when it cannot be found; the module's own exceptions propagate."""
    if target.endswith(".py"):
        return _load_file(Path(target), label, error)
    return _import_module(target, label, error)


def import_callable(reference: str, label: str, error: type[Exception], module_label: str | None = None) -> Any:
    """The callable ``module:qualname`` (or ``path/file.py:qualname``) names. ``error(message)``, naming
    ``label`` and the reference (``module_label`` alone when the module is missing), when the module is
    missing or fails to import, when it has no such attribute, or when that is not callable."""
    target, _, qualname = reference.rpartition(":")
    where = f"{label} {reference!r}"
    try:
        obj: Any = import_user_module(target, module_label or f"{where}:", error)
    except error:
        raise
    except Exception as exc:  # the user's module failed while importing: show its error
        raise error(f"{where}: importing {target!r} failed: {type(exc).__name__}: {exc}") from exc
    for attr in qualname.split("."):
        if not hasattr(obj, attr):
            raise error(f"{where}: {target!r} has no attribute {qualname!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise error(f"{where}: {qualname!r} is not callable (a {type(obj).__name__})")
    return obj


def _load_file(path: Path, label: str, error: type[Exception]) -> ModuleType:
    if not path.is_file():
        raise error(f"{label} file {str(path)!r} does not exist")
    digest = hashlib.sha1(str(path.absolute()).encode()).hexdigest()[:10]
    name = f"reinforge_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise error(f"{label} file {str(path)!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(name: str, label: str, error: type[Exception]) -> ModuleType:
    """``importlib.import_module``, with the working directory first on the path when the top-level
    package is not found otherwise (as ``python -m`` has it; the ``reinforge`` script does not)."""
    if name in sys.modules:  # imported already, or this process's script (``__main__`` has no spec to find)
        return sys.modules[name]
    top, cwd = name.split(".")[0], os.getcwd()
    if importlib.util.find_spec(top) is None and cwd not in sys.path:
        sys.path.insert(0, cwd)
    if importlib.util.find_spec(top) is None:
        raise error(f"{label} module {name!r} is not importable (not installed, not in {cwd})")
    return importlib.import_module(name)


def normalise_plugin(name: str) -> str:
    """A file path made absolute (the module name as is)."""
    if name.endswith(".py"):
        return os.path.normpath(Path(name).expanduser().absolute())
    return name


def load_plugins(plugins: Sequence[str]) -> None:
    """Import every plug-in (once per process); ``PluginError`` naming the one that fails."""
    for i, name in enumerate(plugins):
        try:
            import_user_module(name, f"plugins.{i}")
        except PluginError:
            raise
        except Exception as exc:  # the user's module failed while importing: show its error
            raise PluginError(f"plugins.{i}: importing {name!r} failed: {type(exc).__name__}: {exc}") from exc
