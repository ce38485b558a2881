"""Python objects given to ``reinforge.train`` (reinforge/api.py), as the config values that name them.

- a function: ``module:qualname`` (a reward term's or ``task.verifier``'s reference, or a part's name);
- rows (a list of dicts, a ``datasets.Dataset``): a JSONL file, ``<output_dir>/.datasets/<sha256>.jsonl``;
- a ``transformers`` model object (and its tokenizer): a directory, ``<output_dir>/.models/<sha256>/``.

The files are named by the SHA-256 of their content, so the same rows or weights are written once per
output directory, a saved ``config.yaml`` names them and a resumed run reads them again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SAVE_FILLS = ("architectures", "dtype", "torch_dtype", "transformers_version", "_name_or_path")
"""Model config keys that ``save_pretrained`` sets, left out of a model's digest."""
REWARD_HELP = ("a reward is a function (task, completion) -> float | RewardResult, a verifier's name, a "
               "(reward, weight) pair, or a list of these (or a mapping {term name: reward})")


def function_reference(fn: Any, argument: str) -> str:
    """``module:qualname`` of a top-level function (``path/file.py:qualname`` for a module imported from a
    file); a ValueError naming ``argument`` for a lambda, a nested function, a method or any callable that
    its module does not name: the run records the reference, which other processes and a resume import."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    named: Any = sys.modules.get(module or "")
    for attr in (qualname or "<").split("."):
        named = getattr(named, attr, None)
    if not (module and isinstance(qualname, str)) or "<" in qualname or inspect.ismethod(fn) or named is not fn:
        raise ValueError(f"{argument}={fn!r}: give a function defined at the top level of a module (or a name): "
                         "the run's config records it as module:function, which resuming the run and worker "
                         "processes import (a lambda or a function defined inside another cannot be imported)")
    file = getattr(sys.modules[module], "__file__", None)
    if module.startswith("reinforge_user_") and file:  # a module reinforge imported from a .py file
        return f"{file}:{qualname}"
    return f"{module}:{qualname}"


def is_reward_section(reward: Any) -> bool:
    """``reward=`` a mapping of the ``reward`` section's own keys (``{"pool": "thread"}``), not of terms."""
    from reinforge.config import RewardConfig

    return isinstance(reward, Mapping) and (not reward or bool(set(reward) & set(RewardConfig.model_fields)))


def reward_terms(reward: Any) -> list[dict[str, Any]]:
    """``reward.terms`` from ``reward=``: each function, verifier name or ``(reward, weight)`` pair one term
    (named after the function or verifier, weight 1 unless given); a mapping names its terms; a mapping
    inside a list is a term as a recipe writes it."""
    if isinstance(reward, Mapping):
        items: Iterable[tuple[str | None, Any]] = reward.items()
    elif isinstance(reward, list | tuple) and not _is_pair(reward):
        items = [(None, r) for r in reward]
    else:
        items = [(None, reward)]
    terms = [_term(name, value) for name, value in items]
    if not terms:
        raise ValueError(f"reward={reward!r}: no reward terms; {REWARD_HELP}")
    names = [t["name"] for t in terms]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"reward=: two terms named {', '.join(map(repr, twice))}; name them with a mapping, "
                         "reward={'correct': fn1, 'format': (fn2, 0.2)}")
    return terms


def _is_pair(value: Any) -> bool:
    return (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], int | float)
            and not isinstance(value[1], bool))


def _term(name: str | None, value: Any) -> dict[str, Any]:
    """One term: ``{name, verifier, weight}``, or a mapping as a recipe writes a term (its ``verifier`` may be
    a function; its name defaults to the function's or verifier's)."""
    if isinstance(value, Mapping):
        term = dict(value)
        if "verifier" in term and not isinstance(term["verifier"], str):
            term["verifier"] = _term(None, term["verifier"])["verifier"]
        if name is not None or ("name" not in term and isinstance(term.get("verifier"), str)):
            rest = {k: v for k, v in term.items() if k != "name"}
            term = {"name": name or _term(None, term["verifier"])["name"], **rest}
        return term
    value, weight = value if _is_pair(value) else (value, 1.0)
    if isinstance(value, str):
        verifier = value
    elif callable(value):
        verifier = function_reference(value, "reward")
    else:
        raise TypeError(f"reward=: {value!r} is not a reward; {REWARD_HELP}")
    return {"name": name or verifier.rpartition(":")[2].rpartition(".")[2], "verifier": verifier,
            "weight": float(weight)}


def _datasets_class(obj: Any) -> str | None:
    """The class name of a Hugging Face ``datasets`` object (``Dataset``, ``DatasetDict``, ...), else None."""
    return type(obj).__name__ if type(obj).__module__.split(".")[0] == "datasets" else None


def is_rows(obj: Any) -> bool:
    """Rows given as data: a list or tuple (of mappings, checked as they are written), or a ``datasets`` object."""
    return _datasets_class(obj) is not None or (isinstance(obj, list | tuple) and not isinstance(obj, str))


def _plugin_of(fn: Any) -> str | None:
    """The plug-in that registers ``fn`` (its module, or its file for one imported from a path); None for
    one of reinforge's own parts."""
    module = getattr(fn, "__module__", "") or ""
    if module == "reinforge" or module.startswith("reinforge."):
        return None
    file = getattr(sys.modules.get(module), "__file__", None)
    return file if module.startswith("reinforge_user_") and file else module


class Inputs:
    """The objects of one ``reinforge.train`` call as config values. ``recipe`` and ``overrides`` (preset,
    output_dir, plugins) give the recipe they go over: its ``output_dir`` holds the caches, its plug-ins are
    kept beside the ones added for registered part functions."""

    def __init__(self, recipe: str | Path | None = None, overrides: list[str] | None = None) -> None:
        self._recipe, self._overrides = recipe, list(overrides or [])
        self._data: dict[str, Any] | None = None
        self.plugins: list[str] = []  # the modules that register part functions given as objects

    def _base(self) -> dict[str, Any]:
        if self._data is None:
            from reinforge.config.recipes import recipe_data

            self._data = recipe_data(self._recipe, self._overrides)
        return self._data

    def cache(self, what: str) -> Path:
        """``<output_dir>/.<what>`` (absolute), created."""
        from reinforge.config import RunConfig

        root = Path(self._base().get("output_dir") or RunConfig.model_fields["output_dir"].default).absolute()
        (root / f".{what}").mkdir(parents=True, exist_ok=True)
        return root / f".{what}"

    def all_plugins(self, given: list[str] | None) -> list[str] | None:
        """``plugins`` for the config: the given (or the recipe's) ones and those added, or None to leave
        the recipe's alone."""
        if not self.plugins:
            return given
        base = given if given is not None else self._base().get("plugins") or []
        return list(dict.fromkeys([*([base] if isinstance(base, str) else base), *self.plugins]))

    def part(self, kind: str, value: Any, argument: str) -> Any:
        """A part field's value with a function in it named: a registered part by its name (its module
        becomes a plug-in), any other function by ``module:qualname`` where the registry takes references."""
        if isinstance(value, Mapping) and callable(value.get("name")):
            return {**value, "name": self.part(kind, value["name"], f"{argument}.name")}
        if isinstance(value, str) or not callable(value):
            return value
        from reinforge.parts import all_kinds

        registry = all_kinds()[kind]
        name = next((e.name for e in registry.entries()  # registered by name (not by reference, as below)
                     if getattr(e.fn, "make", e.fn) is value and ":" not in e.name), None)
        if name is not None:
            plugin = _plugin_of(value)
            self.plugins += [plugin] if plugin else []
            return name
        if not registry.references:
            raise TypeError(f"{argument}={value!r}: a {registry.kind} given as a function must be registered by its "
                            "module (docs/extending.md); pass the registered function or its name")
        return function_reference(value, argument)

    def rows(self, data: Any, argument: str) -> str:
        """Rows written once as ``<output_dir>/.datasets/<sha256>.jsonl``; its absolute path."""
        kind = _datasets_class(data)
        if not is_rows(data):
            raise TypeError(f"{argument}={data!r}: give rows (a list of dicts, a datasets.Dataset) or a file's path")
        if kind is not None and kind.endswith("DatasetDict"):
            splits = [str(split) for split in data]
            example = ", ".join(f"{a}=ds[{s!r}]" for a, s in zip(("task", "heldout"), splits, strict=False))
            raise ValueError(f"{argument}= is a {kind} with splits {', '.join(splits)}: give one split, e.g. {example}")
        root = self.cache("datasets")
        staging = root / f".staging-{uuid.uuid4().hex}.jsonl"
        try:
            with staging.open("x", encoding="utf-8") as f:
                digest = _write_rows(data, f, argument)
            final = root / f"{digest}.jsonl"
            os.replace(staging, final)  # the same content under the same name: replacing it changes nothing
        finally:
            staging.unlink(missing_ok=True)
        return str(final)

    def model(self, model: Any, tokenizer: Any) -> str:
        """A ``transformers`` model (and tokenizer) saved once as ``<output_dir>/.models/<sha256>/``; its path."""
        if tokenizer is None:
            tokenizer = _tokenizer_of(model)
        if not hasattr(tokenizer, "save_pretrained"):
            raise TypeError(f"tokenizer={tokenizer!r}: give a transformers tokenizer (with save_pretrained)")
        root = self.cache("models")
        staging = root / f".staging-{uuid.uuid4().hex}"
        staging.mkdir()
        try:
            tokenizer.save_pretrained(staging)
            final = root / _model_digest(model, staging)
            if not (final / "config.json").is_file():
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()
                model.save_pretrained(staging)
                try:
                    os.rename(staging, final)  # whole or not at all
                except OSError:
                    if not (final / "config.json").is_file():  # not another process's copy of the same model
                        raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(final)


def _write_rows(data: Any, out: Any, argument: str) -> str:
    """Each row as one JSON line into ``out``; the SHA-256 of the lines."""
    digest, count = hashlib.sha256(), 0
    for i, row in enumerate(data):
        if not isinstance(row, Mapping):
            raise TypeError(f"{argument}=: row {i} is a {type(row).__name__}, not a mapping of column -> value")

        def refuse(obj: Any, i: int = i) -> Any:
            raise TypeError(f"{argument}=: row {i} holds {obj!r} ({type(obj).__name__}), not a JSON value")

        line = json.dumps(dict(row), ensure_ascii=False, default=refuse) + "\n"
        digest.update(line.encode())
        out.write(line)
        count += 1
    if count == 0:
        raise ValueError(f"{argument}=: no rows")
    return digest.hexdigest()


def _tokenizer_of(model: Any) -> Any:
    """The tokenizer saved beside a model loaded from a local directory (``model.name_or_path``)."""
    source = getattr(model, "name_or_path", "") or ""
    if not source or not Path(source).is_dir():
        raise TypeError(f"model=: give the model's tokenizer too (tokenizer=...): model.name_or_path {source!r} is "
                        "not a local directory to take it from")
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(source)


def _model_digest(model: Any, tokenizer_dir: Path) -> str:
    """SHA-256 of a model's class and config, its weights (names, dtypes, shapes, bytes) and the saved tokenizer
    files (the config without the keys ``save_pretrained`` fills in, so a model saved once hashes the same)."""
    import torch

    config = {k: v for k, v in model.config.to_dict().items() if k not in SAVE_FILLS}
    digest = hashlib.sha256(f"{type(model).__qualname__}:{json.dumps(config, sort_keys=True, default=str)}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy())
    for file in sorted(tokenizer_dir.iterdir()):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def model_path(model: Any, tokenizer: Any, inputs: Inputs) -> str | None:
    """``model.path`` for ``model=`` (a path, a shipped alias, or a model object) and ``tokenizer=``."""
    if model is None or isinstance(model, str | os.PathLike):
        if tokenizer is not None:
            raise TypeError("tokenizer= goes with model= a model object; a model directory has its own tokenizer")
        return None if model is None else os.fspath(model)
    if not (hasattr(model, "save_pretrained") and hasattr(model, "config")):
        raise TypeError(f"model={type(model).__name__}: give a model directory, a shipped alias (tiny-base) or a "
                        "transformers PreTrainedModel")
    return inputs.model(model, tokenizer)


def task_section(task: Any, heldout: Any, inputs: Inputs) -> dict[str, Any] | None:
    """The ``task`` section for ``task=`` rows or a mapping whose ``path`` / ``heldout_path`` are rows (each
    cached, ``Inputs.rows``; a ``table`` task unless the mapping names its kind), and ``heldout=`` rows or a
    path; None when ``task`` is a kind's name or None and no ``heldout`` is given."""
    if _datasets_class(task) is None and isinstance(task, Mapping):
        section = dict(task)
    elif is_rows(task):
        section = {"path": task}
    elif task is None or isinstance(task, str):
        section = {}
    else:
        raise TypeError(f"task={task!r}: give a task kind (arithmetic, jsonl, table, ...), a task section (a dict) "
                        "or rows (a list of dicts, a datasets.Dataset)")
    if heldout is not None:
        section["heldout_path"] = heldout
    data = [k for k in ("path", "heldout_path") if k in section and not isinstance(section[k], str | os.PathLike)]
    for key in data:
        argument = "heldout" if key == "heldout_path" and heldout is not None else "task"
        section[key] = inputs.rows(section[key], argument)
    if "path" in data and "kind" not in section:
        section = {"kind": "table", **section}
    return section or None
