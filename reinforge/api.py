"""The one-call Python API, mirroring ``reinforge train``: for notebooks and scripts.

    import reinforge
    run = reinforge.train(preset="grpo", model="tiny-base", task="arithmetic", reward="exact_match",
                          train={"steps": 50}, **{"algo.policy_loss.clip_high": 0.28})
    run.heldout_after, run.metrics()[-1]["reward/mean"], run.run_dir

Every argument becomes the dotted override the command line would take: ``model`` sets
``model.path``, ``task`` ``task.kind`` (or the whole ``task`` section when a mapping), ``reward``
``task.verifier`` (a registered verifier, ``module:function``, ``file.py:function``, or a function
of yours: it is named by its module and qualified name, so define it in an importable module when
``reward.pool`` runs processes or rollout runs in workers), a mapping keyword a whole section
(``train={"steps": 50}``), a dotted keyword one key (``**{"algo.policy_loss.clip_high": 0.28}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reinforge.orchestrate.loop import TrainResult


def train(
    recipe: str | Path | None = None,
    *,
    model: str | None = None,
    task: str | Mapping[str, Any] | None = None,
    reward: str | Callable[..., Any] | None = None,
    preset: str | None = None,
    plugins: Sequence[str] | None = None,
    resume: str | Path | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train a policy as ``reinforge train [recipe] key=value ...`` would; returns the run's result
    (``run_dir``, ``steps``, held-out accuracy before/after, ``metrics()``)."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train as run_train

    dotted = _overrides(model=model, task=task, reward=reward, preset=preset, plugins=plugins, **overrides)
    if resume is not None:
        return run_train(None, resume=Path(resume), overrides=dotted)
    return run_train(load_config(recipe, dotted))


def _overrides(*, model: Any, task: Any, reward: Any, preset: Any, plugins: Any, **sections: Any) -> list[str]:
    """The keyword arguments as ``key.path=value`` overrides (values as JSON, which YAML reads)."""
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
    if reward is not None:
        out.append(f"task.verifier={json.dumps(reward if isinstance(reward, str) else _reference(reward))}")
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
        raise ValueError(f"reward={fn!r}: give a function defined at the top level of a module (or its name)")
    return f"{module}:{name}"
