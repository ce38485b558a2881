"""Format rewards: does the completion have the structure the prompt asked for?"""

from __future__ import annotations

import re
from functools import lru_cache

from reinforge.rewards.verifiers import VERIFIERS, RewardResult
from reinforge.types import Task

_TAG_NAME = re.compile(r"[A-Za-z_][\w.-]*")


@lru_cache(maxsize=64)
def _structure(think: str, answer: str, prefilled: bool) -> re.Pattern[str]:
    opening = "" if prefilled else re.escape(f"<{think}>")
    return re.compile(
        rf"\A\s*{opening}.*?{re.escape(f'</{think}>')}\s*{re.escape(f'<{answer}>')}(.*?){re.escape(f'</{answer}>')}\s*\Z",
        re.S,
    )


@VERIFIERS.register(
    "think_answer_format",
    formula="r = 1 if completion = <think>...</think> <answer>...</answer> (each tag once, in order, answer not empty, nothing after) else 0",
    paper="DeepSeek-AI 2025, DeepSeek-R1 format reward (arXiv:2501.12948)",
)
def think_answer_format(task: Task, completion: str) -> RewardResult:
    """1 when the completion is ``<think>...</think>`` then ``<answer>...</answer>``, with only whitespace
    before, between and after, each of the four tags exactly once and a non-blank answer.
    ``task.metadata``: ``think_tag`` / ``answer_tag`` rename the tags (default "think", "answer");
    ``think_prefilled: true`` when the prompt already ends with ``<think>`` (the completion must then
    not open it again). ``answer`` is the answer tag's stripped content."""
    think = task.metadata.get("think_tag", "think")
    answer_tag = task.metadata.get("answer_tag", "answer")
    prefilled = bool(task.metadata.get("think_prefilled", False))
    for tag in (think, answer_tag):
        if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
            raise ValueError(f"task {task.id!r}: a format tag name must match {_TAG_NAME.pattern}, got {tag!r}")
    expected = {f"<{think}>": 0 if prefilled else 1, f"</{think}>": 1, f"<{answer_tag}>": 1, f"</{answer_tag}>": 1}
    if any(completion.count(tag) != n for tag, n in expected.items()):
        return RewardResult(0.0, False, None)
    match = _structure(think, answer_tag, prefilled).fullmatch(completion)
    content = match.group(1).strip() if match else ""
    ok = bool(content)
    return RewardResult(float(ok), ok, content or None)
