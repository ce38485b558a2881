"""The ``reasoning_gym`` verifier: a reasoning-gym task's own ``score_answer`` (the tasks are made by
``data/reasoning_gym.py``, whose docstring describes the scoring). Importing this module registers it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from reinforge.data.reasoning_gym import create_dataset, require_reasoning_gym
from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, RewardResult
from reinforge.types import Task


@functools.lru_cache(maxsize=64)
def _scorer(name: str, params_json: str) -> Callable[..., float]:
    return create_dataset(name, json.loads(params_json)).score_answer


@VERIFIERS.register(
    "reasoning_gym",
    formula="r = score_answer(answer in the last <answer></answer> tags, entry) of the task's reasoning-gym "
            "dataset; correct = r >= 1",
    paper="Stojanovski et al. 2025, REASONING GYM: Reasoning Environments for RL with Verifiable Rewards",
    needs=(CPU_BOUND,),
)
def reasoning_gym_score(task: Task, completion: str) -> RewardResult:
    """Score with the reasoning-gym task's own ``score_answer`` (the task is rebuilt from
    ``metadata["task"]`` and ``metadata["rg_params"]``, once per process)."""
    meta = task.metadata
    if "rg_entry" not in meta or "task" not in meta:
        raise ValueError(f"task {task.id!r} is not a reasoning-gym task: its metadata has no 'task' and 'rg_entry'")
    tag = meta.get("rg_answer_tag", "answer")
    if tag is None:
        answer: str | None = completion.strip()
    else:
        require_reasoning_gym()
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(completion, tag_name=tag)
    params = json.dumps(meta.get("rg_params") or {}, sort_keys=True)
    scorer, entry = _scorer(meta["task"], params), meta["rg_entry"]
    try:
        score = float(scorer(answer=answer, entry=entry))
    except Exception:
        if not _reads_its_reference(scorer, entry):
            raise  # the scorer is broken, not the answer: the reward pool's error policy decides
        score = 0.0
    return RewardResult(score, score >= 1.0, answer)


def _reads_its_reference(scorer: Callable[..., float], entry: dict[str, Any]) -> bool:
    """Whether ``scorer`` scores the entry's own reference answer without raising. Some tasks' scorers
    raise on an answer they cannot parse (prime_factorization on "zzz", boxnet on "-1"): when the same
    scorer reads the reference, the fault is the model's answer, which then scores 0."""
    try:
        scorer(answer=None if entry.get("answer") is None else str(entry["answer"]), entry=entry)
    except Exception:
        return False
    return True
