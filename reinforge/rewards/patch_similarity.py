"""SWE-RL's rule-based reward: how similar the model's code change is to the oracle change.

Wei et al. 2025, SWE-RL: Advancing LLM Reasoning via Reinforcement Learning on Open Software Evolution
(arXiv:2502.18449), checked against the authors' reward (facebookresearch/swe-rl, ``src/swerl/core/reward.py``):
the completion is ``<think>...</think><solution>...</solution>``, the solution a list of search/replace edits;
the edits are applied to the files, each changed file becomes a unified diff (3 lines of context), and the
reward is the mean over the files either side changed of ``difflib.SequenceMatcher(pred, oracle).ratio()``,
or -1 when the format is wrong.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping

from reinforge.rewards.verifiers import CPU_BOUND, VERIFIERS, RewardResult
from reinforge.types import Task

FORMAT_ERROR_REWARD = -1.0
_TAGS = ("<think>", "</think>", "<solution>", "</solution>")
_EDIT = re.compile(
    r"```[^\n]*\n### (?P<path>[^\n]*)\n<<<<<<< SEARCH\n(?P<search>[\s\S]*?)\n=======\n"
    r"(?P<replace>[\s\S]*?)\n>>>>>>> REPLACE\n```"
)


class PatchFormatError(ValueError):
    """The completion breaks SWE-RL's output format (the reward is then -1)."""


def solution_text(completion: str) -> str:
    """The ``<solution>`` block of ``<think>thought</think><solution>...</solution>``: each of the four tags
    exactly once and a non-blank thought, else ``PatchFormatError``."""
    for tag in _TAGS:
        if completion.count(tag) != 1:
            raise PatchFormatError(f"{tag} appears {completion.count(tag)} times, not once")
    thought = completion.split("<think>", 1)[1].split("</think>", 1)[0]
    if not thought.strip():
        raise PatchFormatError("the thought is empty")
    return completion.split("<solution>", 1)[1].split("</solution>", 1)[0].strip()


def parse_edits(solution: str) -> dict[str, list[tuple[str, str]]]:
    """``{path: [(search, replace), ...]}`` from fenced ``### path`` / ``<<<<<<< SEARCH`` / ``=======`` /
    ``>>>>>>> REPLACE`` blocks, in order of appearance."""
    edits: dict[str, list[tuple[str, str]]] = {}
    for match in _EDIT.finditer(solution):
        edits.setdefault(match["path"], []).append((match["search"], match["replace"]))
    return edits


def apply_edits(files: Mapping[str, str], edits: Mapping[str, list[tuple[str, str]]]) -> dict[str, str]:
    """The new content of every edited file. A search block matches whole lines (it is looked up after a
    newline); one that is absent, or equal to its replacement, is a ``PatchFormatError``."""
    new_files: dict[str, str] = {}
    for path, pairs in edits.items():
        content = "\n" + files.get(path, "")
        for search, replace in pairs:
            if search == replace:
                raise PatchFormatError(f"{path}: a search block equals its replacement")
            if "\n" + search not in content:
                raise PatchFormatError(f"{path}: search block not found: {search[:60]!r}")
            content = content.replace("\n" + search, "\n" + replace)
        new_files[path] = content[1:]
    return new_files


def unified_diff(old: str, new: str, context: int = 3) -> str:
    """The unified diff of two texts without its two ``---``/``+++`` header lines ("" when equal)."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=context)
    return "\n".join(list(lines)[2:])


def file_diffs(files: Mapping[str, str], new_files: Mapping[str, str]) -> dict[str, str]:
    """``{path: diff}`` of the files whose content changed."""
    diffs = {path: unified_diff(files.get(path, ""), new) for path, new in new_files.items()}
    return {path: diff for path, diff in diffs.items() if diff}


def patch_similarity_score(predicted: Mapping[str, str], oracle: Mapping[str, str]) -> float:
    """Mean over the files either patch changes of ``SequenceMatcher(None, pred, oracle, autojunk=False).ratio()``
    (a file only one side changes scores 0); 1 when neither changes anything."""
    paths = sorted(set(predicted) | set(oracle))
    if not paths:
        return 1.0
    scores = [
        difflib.SequenceMatcher(None, predicted[p], oracle[p], autojunk=False).ratio()
        if predicted.get(p) and oracle.get(p) else 0.0
        for p in paths
    ]
    return sum(scores) / len(scores)


def _task_files(task: Task) -> tuple[dict[str, str], dict[str, str]]:
    meta = task.metadata
    for key in ("files", "oracle_files"):
        if not isinstance(meta.get(key), dict):
            raise ValueError(f"task {task.id!r}: patch_similarity needs metadata.{key}, a {{path: content}} mapping")
    return meta["files"], meta["oracle_files"]


@VERIFIERS.register(
    "patch_similarity",
    formula="r = -1 if the format is wrong, else mean over changed files f of "
            "SequenceMatcher(diff_pred(f), diff_oracle(f)).ratio() (0 for a file only one side changes)",
    paper="Wei et al. 2025, SWE-RL: Advancing LLM Reasoning via Reinforcement Learning on Open Software "
          "Evolution (arXiv:2502.18449)",
    needs=(CPU_BOUND,),
)
def patch_similarity(task: Task, completion: str) -> RewardResult:
    """SWE-RL's reward. ``task.metadata``: ``files`` (path -> content before) and ``oracle_files`` (path ->
    content after the oracle change). The completion's search/replace edits are applied to ``files``;
    ``correct`` when the predicted diff equals the oracle diff (reward 1); ``answer``: the predicted diff."""
    files, oracle_files = _task_files(task)
    oracle = file_diffs(files, oracle_files)
    try:
        predicted = file_diffs(files, apply_edits(files, parse_edits(solution_text(completion))))
    except PatchFormatError:
        return RewardResult(FORMAT_ERROR_REWARD, False, None)
    reward = patch_similarity_score(predicted, oracle)
    answer = "\n".join(f"### {p}\n{predicted[p]}" for p in sorted(predicted))
    return RewardResult(reward, predicted == oracle, answer)
