"""Procedural tasks from reasoning-gym (an optional extra), scored by each task's own ``score_answer``.

    reasoning_gym_splits("leg_counting", size=2000, heldout_size=200, params={"max_animals": 5})
    reasoning_gym_splits([{"name": "basic_arithmetic", "weight": 2}, {"name": "leg_counting"}], ...)

**Splits.** reasoning-gym generates item ``i`` of a dataset with seed ``s`` from ``Random(s + i)``, so
two datasets whose seeds differ by less than their size share items: a held-out split "from another
seed" would overlap the train split. Instead one dataset of ``heldout_size + size`` items is built
per task; items ``0 .. heldout_size-1`` are held out and the rest are for training (so the held-out
split does not change with ``size``). Items are generated with Python's and numpy's global generators
seeded from the task's seed as well (and restored after), because a few tasks draw from them: the
same seed gives the same items in every run, which exact resumption needs. Held-out questions are
then deduplicated, and every training item whose question text also is a held-out question is
dropped: the splits never share a question.

**Mixtures.** A list of ``{"name", "weight", "params"}``. We build the mixture ourselves rather than
with reasoning-gym's ``composite`` dataset, which draws each item's task at random: here each task
gets exactly its weight's share of ``size`` and of ``heldout_size`` (largest remainder), so
per-task held-out accuracy is measured on a known number of items, and the verifier scores an item
with its own task alone (the composite's scorer needs the whole composite rebuilt). Each task of a
mixture has its own seed derived from ``(seed, position)``; a single task uses ``seed`` itself, so
its items are exactly ``reasoning_gym.create_dataset(name, seed=seed, ...)``'s.

**Scoring.** The ``reasoning_gym`` verifier reads the answer inside the last ``<answer>...</answer>``
tags (reasoning-gym's convention, ``reasoning_gym.utils.extract_answer``; the whole completion when
the tasks were built with ``answer_tag=None``) and returns the task's ``score_answer`` as the reward;
``correct`` means a score of 1. An answer the task's scorer cannot parse (some scorers raise on
one) scores 0; a scorer that raises on its own reference answer too is broken, and that error is
raised for the reward pool's error policy. The verifier is ``rewards/reasoning_gym.py``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from reinforge.data.base import TaskSplits
from reinforge.errors import ConfigError
from reinforge.types import Task

INSTALL_HINT = "pip install 'reinforge[reasoning-gym]'"
PREFIX = "reasoning_gym/"


@dataclasses.dataclass(frozen=True)
class RGTaskSpec:
    """One reasoning-gym task of a mixture: its registered name, relative weight and config params."""

    name: str
    weight: float = 1.0
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def require_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"reasoning-gym tasks need the reasoning-gym package: {INSTALL_HINT}") from None
    return reasoning_gym


def _specs(tasks: str | Sequence[RGTaskSpec | Mapping[str, Any]], params: Mapping[str, Any] | None) -> list[RGTaskSpec]:
    if isinstance(tasks, str):
        return [RGTaskSpec(tasks.removeprefix(PREFIX), 1.0, dict(params or {}))]
    if params:
        raise ConfigError("reasoning_gym: give params per task in a mixture ({name, weight, params}), not globally")
    specs = []
    for i, t in enumerate(tasks):
        if isinstance(t, Mapping):
            unknown = set(t) - {"name", "weight", "params"}
            if "name" not in t or unknown:
                raise ConfigError(f"reasoning_gym mixture item {i}: expected keys name, weight, params; got {sorted(t)}")
            t = RGTaskSpec(str(t["name"]), float(t.get("weight", 1.0)), dict(t.get("params") or {}))
        specs.append(dataclasses.replace(t, name=t.name.removeprefix(PREFIX)))
    if not specs:
        raise ConfigError("reasoning_gym: the mixture is empty")
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise ConfigError(f"reasoning_gym: a task appears twice in the mixture: {names}")
    if any(not s.weight > 0 for s in specs):
        raise ConfigError(f"reasoning_gym: weights must be > 0, got {[s.weight for s in specs]}")
    return specs


def _shares(total: int, weights: list[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder, ties to the first)."""
    exact = np.array(weights) / sum(weights) * total
    counts = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return [int(c) for c in counts]


def create_dataset(name: str, params: Mapping[str, Any], **size_seed: int) -> Any:
    """``reasoning_gym.create_dataset`` with errors turned into ConfigErrors naming the task and fields."""
    rg = require_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if name == "composite":
        raise ConfigError("reasoning_gym: give a mixture as a list of tasks (task.rg_tasks: [{name, weight, params}, "
                          "...]) rather than reasoning-gym's 'composite' dataset")
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(DATASETS)} tasks: {', '.join(sorted(DATASETS)[:8])}, ...)"
        raise ConfigError(f"reasoning_gym: unknown task {name!r}{hint}")
    fields = sorted(f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("seed", "size"))
    bad = sorted(set(params) - set(fields))
    if bad or {"seed", "size"} & set(params):
        raise ConfigError(f"reasoning_gym task {name!r}: unknown params {bad or sorted({'seed', 'size'} & set(params))}"
                          f"; allowed: {', '.join(fields)} (size and seed are set by the task config)")
    try:
        return rg.create_dataset(name, **params, **size_seed)
    except (AssertionError, ValueError, TypeError) as e:
        raise ConfigError(f"reasoning_gym task {name!r}: invalid params {dict(params)}: {e}") from None


@contextlib.contextmanager
def _global_rngs_seeded(seed: int) -> Iterator[None]:
    """Seed Python's and numpy's global generators for the block, then restore their states. A few
    reasoning-gym tasks (``list_functions``) draw from the global ``random`` while generating items,
    so without this their items change from run to run despite the dataset's seed."""
    py_state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _derived_seed(seed: int, position: int) -> int:
    return int(np.random.SeedSequence([seed, position]).generate_state(1)[0])


def _task(spec: RGTaskSpec, category: str, index: int, entry: dict[str, Any], chat: bool,
          answer_tag: str | None) -> Task:
    question = entry["question"]
    meta: dict[str, Any] = {
        "task": spec.name, "category": category, "rg_params": dict(spec.params), "rg_entry": entry,
        "rg_answer_tag": answer_tag,
    }
    for key in ("difficulty", "source"):
        if key in (entry.get("metadata") or {}):
            meta[key] = entry["metadata"][key]
    return Task(
        id=f"{spec.name}:{index}",
        prompt=[{"role": "user", "content": question}] if chat else question,
        answer="" if entry.get("answer") is None else str(entry["answer"]),
        metadata=meta,
    )


def _question(task: Task) -> str:
    return task.metadata["rg_entry"]["question"]


def reasoning_gym_splits(
    tasks: str | Sequence[RGTaskSpec | Mapping[str, Any]],
    size: int = 1000,
    seed: int = 1234,
    heldout_size: int = 100,
    params: Mapping[str, Any] | None = None,
    *,
    chat: bool = True,
    answer_tag: str | None = "answer",
) -> TaskSplits:
    """Train / held-out splits of one reasoning-gym task (``"leg_counting"`` or
    ``"reasoning_gym/leg_counting"``, with ``params`` for its config) or of a weighted mixture.

    ``size`` training items (fewer if some repeat a held-out question) and ``heldout_size`` held-out
    items (fewer if the task repeats questions); see the module docstring for the guarantees.
    ``chat``: prompts are one user message (default) or raw text. ``answer_tag``: the tag the
    verifier reads the answer from (None: the whole completion).
    """
    if size < 1 or heldout_size < 0:
        raise ConfigError(f"reasoning_gym: size must be >= 1 and heldout_size >= 0, got {size}, {heldout_size}")
    specs = _specs(tasks, params)
    weights = [s.weight for s in specs]
    train_n, held_n = _shares(size, weights), _shares(heldout_size, weights)
    train: list[Task] = []
    heldout: list[Task] = []
    for k, spec in enumerate(specs):
        n_held, n_total = held_n[k], held_n[k] + train_n[k]
        if n_total == 0:
            continue
        task_seed = seed if len(specs) == 1 else _derived_seed(seed, k)
        with _global_rngs_seeded(task_seed):
            ds = create_dataset(spec.name, spec.params, size=n_total, seed=task_seed)
            items = [_task(spec, ds.category, i, ds[i], chat, answer_tag) for i in range(n_total)]
        heldout += items[:n_held]
        train += items[n_held:]
    unique: dict[str, Task] = {}
    for t in heldout:
        unique.setdefault(_question(t), t)
    heldout, held_questions = list(unique.values()), set(unique)
    train = [t for t in train if _question(t) not in held_questions]
    if not train:
        raise ConfigError(f"reasoning_gym {[s.name for s in specs]}: every training item repeats a held-out "
                          "question; the task's params allow too few distinct questions")
    label = ", ".join(f"{s.name}" + (f"x{s.weight:g}" if len(specs) > 1 else "") for s in specs)
    return TaskSplits(train, heldout, name=f"reasoning_gym({label})")
