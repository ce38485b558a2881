"""The one-call Python API, mirroring ``reinforge train``: for notebooks and scripts.

    import reinforge
    run = reinforge.train(preset="grpo", model="tiny-base", task="arithmetic", verifier="exact_match",
                          train={"steps": 50}, **{"algo.policy_loss.clip_high": 0.28})
    run.heldout_after, run.metrics()[-1]["reward/mean"], run.run_dir

Every argument becomes the dotted override the command line would take: ``model`` sets
``model.path``, ``task`` ``task.kind`` (or the whole ``task`` section when a mapping), ``verifier``
``task.verifier`` (a registered verifier, ``module:function``, ``file.py:function``, or a function
``(task, completion) -> RewardResult | float`` of yours: it is named by its module and qualified
name, so define it in an importable module when ``reward.pool`` runs processes or rollout runs in
workers), a mapping keyword a whole section (``train={"steps": 50}``, ``reward={"terms": [...]}``),
a dotted keyword one key (``**{"algo.policy_loss.clip_high": 0.28}``).

``verifier=`` was called ``reward=`` and set ``task.verifier`` all the same; the keyword is now named
after the field it sets. That field is the run's whole reward while the recipe composes no
``reward.terms`` (terms replace it), so it is the one honest home for a single name or function: a
reward term would need a name and a weight, would replace a recipe's terms whole and would log as
``reward/term/<name>``. ``reward=`` with a name or a function still works, as a deprecated alias of
``verifier=`` (it warns: ``DeprecationWarning``); ``reward=`` with a mapping is the ``reward`` section,
like any other section keyword (``reward={"pool": "process"}``).
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reinforge.orchestrate.loop import TrainResult


def train(
    recipe: str | Path | None = None,
    *,
    model: str | None = None,
    task: str | Mapping[str, Any] | None = None,
    verifier: str | Callable[..., Any] | None = None,
    preset: str | None = None,
    plugins: Sequence[str] | None = None,
    resume: str | Path | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train a policy as ``reinforge train [recipe] key=value ...`` would; returns the run's result
    (``run_dir``, ``steps``, held-out accuracy before/after, ``metrics()``). ``verifier`` sets
    ``task.verifier``; ``reward=`` a name or function is its deprecated alias (module docstring)."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train as run_train

    dotted = _overrides(model=model, task=task, verifier=verifier, preset=preset, plugins=plugins, **overrides)
    if resume is not None:
        return run_train(None, resume=Path(resume), overrides=dotted)
    return run_train(load_config(recipe, dotted))


def _verifier_alias(verifier: Any, overrides: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``reward=`` a name or a function, the old spelling of ``verifier=``, moved there with a warning;
    ``reward=`` a mapping stays in ``overrides`` (the ``reward`` section)."""
    reward = overrides.get("reward")
    if isinstance(reward, Mapping) or "reward" not in overrides:
        return verifier, overrides
    rest = {k: v for k, v in overrides.items() if k != "reward"}
    if reward is None:
        return verifier, rest
    if verifier is not None:
        raise TypeError("reinforge.train: give verifier= alone (reward= with a name or function is its old spelling)")
    warnings.warn("reinforge.train(reward=...) is deprecated: it sets task.verifier, use verifier=... "
                  "(reward={...} is the reward section)", DeprecationWarning, stacklevel=_callers_level())
    return reward, rest


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning raised by the caller
    of this function (``reinforge.train`` calls ``train`` from ``reinforge/__init__.py``)."""
    package, frame, level = str(Path(__file__).parent), sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _overrides(*, model: Any, task: Any, preset: Any, plugins: Any, verifier: Any = None, **sections: Any
               ) -> list[str]:
    """The keyword arguments as ``key.path=value`` overrides (values as JSON, which YAML reads); ``reward=``
    a name or function is ``verifier=``'s deprecated alias (``_verifier_alias``)."""
    verifier, sections = _verifier_alias(verifier, sections)
    out: list[str] = []
    if preset is not None:
        out.append(f"preset={preset}")
    if plugins is not None:
        out.append(f"plugins={json.dumps(list(plugins))}")
    if model is not None:
        out.append(f"model.path={json.dumps(str(model))}")
    if isinstance(task, Mapping):
        sections = {"task": task, **sections}
    elif task is not None:
        out.append(f"task.kind={json.dumps(task)}")
    if verifier is not None:
        out.append(f"task.verifier={json.dumps(verifier if isinstance(verifier, str) else _reference(verifier))}")
    for key, value in sections.items():
        out += _flatten(key, value)
    return out


def _flatten(key: str, value: Any) -> list[str]:
    """One override per leaf; a part field's ``{name, <option>: ...}`` is one value (it replaces a part
    of another name whole, as on the command line)."""
    from reinforge.config.recipes import is_part_field

    if isinstance(value, Mapping) and not is_part_field(key.split(".")):
        return [item for k, v in value.items() for item in _flatten(f"{key}.{k}", v)]
    return [f"{key}={json.dumps(value)}"]


def _reference(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function, the form ``task.verifier`` takes for your own reward."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or "<" in name:
        raise ValueError(f"verifier={fn!r}: give a function defined at the top level of a module (or its name)")
    return f"{module}:{name}"
