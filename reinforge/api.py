"""The one-call Python API, mirroring ``reinforge train``: for notebooks and scripts.

    import reinforge

    def concise(task, completion):  # (Task, str) -> float | RewardResult, at the top level of a module
        return 1.0 if completion.strip() == task.answer else 0.0

    run = reinforge.train(preset="grpo", model="tiny-base", reward=[concise, ("numeric_match", 0.5)],
                          task=[{"prompt": "2+2=", "answer": "4"}, ...], train={"steps": 50},
                          **{"algo.policy_loss.clip_high": 0.28, "task.heldout_size": 50})
    run.heldout_after, [m for m in run.metrics() if "reward/mean" in m][-1]["reward/term/concise"], run.run_dir

Every argument becomes the config value the command line would set, as a dotted override, so a run
started here is a recipe plus overrides like any other: its ``config.yaml`` says all and
``reinforge train --resume RUN`` resumes it.

- ``model``: ``model.path``: a model directory, a shipped alias (``tiny-base``), or a ``transformers``
  model object, which is *copied* (``save_pretrained``, with ``tokenizer=`` or the tokenizer in its
  ``name_or_path`` directory) to ``<output_dir>/.models/<sha256>/`` (the same weights are written once);
  the run loads and trains that copy, and the object given is left as it was.
- ``task``: a task kind's name (``task.kind``), a ``task`` section (a mapping), or rows: a list of dicts
  or a ``datasets.Dataset`` (columns as ``task.columns`` names them: ``prompt``, ``answer``, ...), written
  once to ``<output_dir>/.datasets/<sha256>.jsonl`` and read as a ``table`` task (a section's ``path`` may
  be rows too). ``heldout``: rows or a file for ``task.heldout_path`` (else ``task.heldout_size`` rows are
  split off). A ``DatasetDict`` is refused: give one split.
- ``reward``: the run's reward terms (``reward.terms``, each logged as ``reward/term/<name>``): a function
  ``(task, completion) -> float | RewardResult``, a verifier's name (``"exact_match"``), a ``(reward,
  weight)`` pair or a list of these, each term named after its function or verifier with weight 1
  unless given; a mapping ``{name: reward}`` names them. Terms replace ``task.verifier`` (and a
  recipe's terms), so ``verifier=`` with ``reward=`` is an error. ``reward=`` a mapping of the section's
  own keys (``{"pool": "thread"}``) is the ``reward`` section. (``reward=`` a name or a function was
  once an alias of ``verifier=``.)
- ``verifier``: ``task.verifier``, the whole reward while there are no terms: a registered verifier,
  ``module:function``, ``file.py:function`` or a function.
- ``advantage``, ``policy_loss`` (and any part field, e.g. ``algo={"advantage": fn}``): a registered
  part's name, ``{name: ..., <option>: value}``, or a function: one registered by a plug-in is named by
  its registered name and its module added to ``plugins``; any other is named ``module:qualname``,
  which the estimator and loss registries import in every process that looks it up.
- a mapping keyword is a whole section (``train={"steps": 50}``), a dotted keyword one key
  (``**{"algo.policy_loss.clip_high": 0.28}``).

A function is recorded by its module and qualified name, so it must be defined at the top level of a
module: a lambda or a function defined inside another is refused with a ValueError, as a resumed run,
reward worker processes (``reward.pool: process``) and rollout workers (``orchestrate.mode: async``)
import it by that name. (One defined in a script or notebook is ``__main__:name``: found in this process,
but not by a later ``reinforge train --resume``; put it in a module of its own for that.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reinforge.api_inputs import (
    Inputs,
    function_reference,
    is_reward_section,
    model_path,
    reward_terms,
    task_section,
)
from reinforge.orchestrate.loop import TrainResult


def train(
    recipe: str | Path | None = None,
    *,
    model: Any = None,
    tokenizer: Any = None,
    task: Any = None,
    heldout: Any = None,
    reward: Any = None,
    verifier: str | Callable[..., Any] | None = None,
    advantage: Any = None,
    policy_loss: Any = None,
    preset: str | None = None,
    plugins: Sequence[str] | None = None,
    resume: str | Path | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train a policy as ``reinforge train [recipe] key=value ...`` would; returns the run's result
    (``run_dir``, ``steps``, held-out accuracy before/after, ``metrics()``). The arguments: module docstring."""
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train as run_train

    base = Path(resume) / "config.yaml" if resume is not None else recipe
    inputs = Inputs(base, _base_overrides(preset, plugins, overrides.get("output_dir")))
    dotted = _overrides(model=model, tokenizer=tokenizer, task=task, heldout=heldout, reward=reward, verifier=verifier,
                        advantage=advantage, policy_loss=policy_loss, preset=preset, plugins=plugins, inputs=inputs,
                        **overrides)
    if resume is not None:
        return run_train(None, resume=Path(resume), overrides=dotted)
    return run_train(load_config(recipe, dotted))


def _base_overrides(preset: Any, plugins: Any, output_dir: Any) -> list[str]:
    """The overrides that decide the recipe's ``output_dir`` and ``plugins`` (``Inputs``)."""
    given = {"preset": preset, "plugins": None if plugins is None else list(plugins), "output_dir": output_dir}
    return [f"{key}={_dumps(value, key)}" for key, value in given.items() if value is not None]


def _overrides(*, model: Any, task: Any, preset: Any, plugins: Any, verifier: Any = None, reward: Any = None,
               tokenizer: Any = None, heldout: Any = None, advantage: Any = None, policy_loss: Any = None,
               inputs: Inputs | None = None, **sections: Any) -> list[str]:
    """The keyword arguments as ``key.path=value`` overrides (values as JSON, which YAML reads); the objects
    among them (functions, rows, a model) named as ``Inputs`` says."""
    inputs = inputs or Inputs(None, _base_overrides(preset, plugins, sections.get("output_dir")))
    rewards = _reward_sections(reward, verifier)  # checked before a model or rows are written
    out: list[str] = [f"preset={preset}"] if preset is not None else []
    path = model_path(model, tokenizer, inputs)
    if path is not None:
        out.append(f"model.path={json.dumps(path)}")
    if isinstance(task, str):
        out.append(f"task.kind={json.dumps(task)}")
    if verifier is not None:
        name = verifier if isinstance(verifier, str) else function_reference(verifier, "verifier")
        out.append(f"task.verifier={json.dumps(name)}")
    section = task_section(task, heldout, inputs)
    parts = {key: value for key, value in (("algo.advantage", advantage), ("algo.policy_loss", policy_loss))
             if value is not None}
    sections = {**({"task": section} if section else {}), **rewards, **parts, **sections}
    for key, value in sections.items():
        out += _flatten(key, value, inputs)
    all_plugins = inputs.all_plugins(None if plugins is None else list(plugins))
    if all_plugins is not None:
        out.insert(int(preset is not None), f"plugins={json.dumps(all_plugins)}")
    return out


def _reward_sections(reward: Any, verifier: Any) -> dict[str, Any]:
    """``reward=`` as sections: the ``reward`` section itself, or its terms (``reward_terms``)."""
    if reward is None:
        return {}
    if is_reward_section(reward):
        return {"reward": reward}
    if verifier is not None:
        raise TypeError("reinforge.train: give verifier= or reward=, not both: reward terms replace task.verifier "
                        "(make the verifier one of the terms: reward=[\"exact_match\", my_reward])")
    return {"reward.terms": reward_terms(reward)}


def _flatten(key: str, value: Any, inputs: Inputs) -> list[str]:
    """One override per leaf; a part field's ``{name, <option>: ...}`` is one value (it replaces a part
    of another name whole, as on the command line), its function named (``Inputs.part``)."""
    from reinforge.config.recipes import part_kind

    kind = part_kind(key.split("."))
    if kind is not None:
        value = inputs.part(kind, value, key)
    elif isinstance(value, Mapping):
        return [item for k, v in value.items() for item in _flatten(f"{key}.{k}", v, inputs)]
    return [f"{key}={_dumps(value, key)}"]


def _dumps(value: Any, key: str) -> str:
    """``value`` as JSON (a path as its string); a TypeError naming ``key`` for anything else."""
    def other(obj: Any) -> Any:
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        what = "a function goes in reward=, verifier= or a part field such as advantage=" if callable(obj) else \
            "not a config value"
        raise TypeError(f"reinforge.train: {key}={obj!r}: {what}")

    return json.dumps(value, default=other)
