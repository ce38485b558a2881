"""Best-of-n with a learned reward: of a prompt's first k samples, the one a reward model scores
highest is the answer (``reinforge eval --rerank PATH``).

The reranker is an outcome reward model (any ``AutoModelForSequenceClassification`` directory, an
autoregressive reward model or an ensemble directory, scored as the ``reward_model`` term scores) or a process reward model (an
``AutoModelForTokenClassification`` directory, ``reinforge prm``): a completion's score is then the
minimum of its step scores (Math-Shepherd ranks by the minimum; Lightman et al. 2023 by the
product, ``--rerank-steps prod``), a completion without steps scoring 0.

    best-of-k = correct[p, argmax_{j < k} score[p, j]]    (ties: the first sample)

Per prompt, with a bootstrap interval over prompts like the other metrics (``eval.heldout.evaluate``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from reinforge.types import Task

StepAggregate = Literal["min", "prod"]
STEP_AGGREGATES = {"min": min, "prod": math.prod}  # a PRM's step scores -> the completion's score


def is_process_reward_model(path: str) -> bool:
    """A token-classification directory (a PRM) rather than a sequence classifier or an ensemble."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return any(str(a).endswith("ForTokenClassification") for a in json.loads(config.read_text()).get("architectures") or [])


def rerank_scores(path: str, tasks: Sequence[Task], completions: Sequence[str], step_separator: str = "\n",
                  steps: StepAggregate = "min", device: str = "cpu") -> list[float]:
    """One score per (task, completion) from the reranker at ``path`` (see the module docstring)."""
    if is_process_reward_model(path):
        from reinforge.rewards.prm import PRMSettings, prm_steps

        settings = PRMSettings(path=path, step_separator=step_separator, device=device)
        out = []
        for task, completion in zip(tasks, completions, strict=True):
            values = [s for _, s in prm_steps(task, completion, settings)]
            out.append(STEP_AGGREGATES[steps](values) if values else 0.0)
        return out
    from reinforge.rewards.reward_model import RewardModelScorer

    return RewardModelScorer(path, device=device).raw_scores(tasks, completions)


def best_of(correct: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Per prompt: the correctness of the highest-scored of the first ``k`` samples."""
    pick = np.argmax(scores[:, :k], axis=1)
    return correct[np.arange(len(correct)), pick]
