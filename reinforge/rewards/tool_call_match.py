"""ToolRL's fine-grained tool-call reward: a format reward plus the match of the predicted tool calls to the
gold ones by tool name, parameter names and parameter values.

Qian et al. 2025, ToolRL: Reward is All Tool Learning Needs (arXiv:2504.13958), checked against the authors'
reward (qiancheng0/ToolRL, ``verl/utils/reward_score/rlla.py``, its default settings): ``r = R_format +
R_correct`` in [-3, 4]. The gold answer and the completion use ToolRL's layout: ``<think>...</think>``, then a
``<tool_call>`` block with one JSON object ``{"name": ..., "parameters": {...}}`` per line and/or a
``<response>...</response>``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from reinforge.rewards.verifiers import VERIFIERS, RewardResult
from reinforge.types import Task

CORRECT_MAX = 3.0
CORRECT_MIN = -3.0
_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_RESPONSE_OPEN, _RESPONSE_CLOSE = "<response>", "</response>"


def multiset_overlap(a: Sequence[Any], b: Sequence[Any]) -> float:
    """1 if the lists are equal, 0 if either is empty, else ``|a ∩ b| / (|a| + |b| - |a ∩ b|)`` over multisets
    (order ignored): the Jaccard index with repeats."""
    if list(a) == list(b):
        return 1.0
    if not a or not b:
        return 0.0
    count_a, count_b = Counter(a), Counter(b)
    inter = sum(min(count_a[k], count_b[k]) for k in count_a.keys() & count_b.keys())
    return inter / (len(a) + len(b) - inter)


def _params(call: dict[str, Any]) -> dict[str, Any]:
    params = call.get("parameters", call.get("arguments", {}))
    return params if isinstance(params, dict) else {}


def _best_match(gold: dict[str, Any], predicted: list[dict[str, Any]], used: set[int]) -> tuple[int, float]:
    """The unused predicted call of the gold call's name with the largest ``overlap(keys) + #equal values``
    (strictly above 0), as ``(index, score)``; ``(-1, 0)`` when none."""
    best, best_score = -1, 0.0
    gold_params = _params(gold)
    for i, call in enumerate(predicted):
        if i in used or call.get("name") != gold.get("name"):
            continue
        params = _params(call)
        score = multiset_overlap(list(gold_params), list(params))
        score += sum(1.0 for k, v in gold_params.items() if k in params and params[k] == v)
        if score > best_score:
            best, best_score = i, score
    return best, best_score


def tool_call_score(gold: list[dict[str, Any]], predicted: list[dict[str, Any]]) -> float:
    """``R_correct = (R_max - R_min) S / S_max + R_min`` with ``S = overlap(gold names, predicted names) +
    sum over gold calls of the best unused same-name predicted call's overlap(parameter names) + #equal values``
    and ``S_max = 1 + sum over gold calls of (1 + #parameters)``; ``R_max`` when the calls are identical."""
    if gold == predicted:
        return CORRECT_MAX
    score = multiset_overlap([c.get("name") for c in gold], [c.get("name") for c in predicted])
    s_max, used = 1.0, set()
    for call in gold:
        s_max += 1.0 + len(_params(call))
        index, best = _best_match(call, predicted, used)
        if index >= 0:
            used.add(index)
            score += best
    return (CORRECT_MAX - CORRECT_MIN) * score / s_max + CORRECT_MIN


def read_tool_calls(text: str) -> list[dict[str, Any]]:
    """The JSON objects, one per line, of the first ``<tool_call>`` block; ``ValueError`` when there is no
    block or a line is not a JSON object."""
    if _CALL_OPEN not in text or _CALL_CLOSE not in text:
        raise ValueError("no <tool_call> block")
    body = text.split(_CALL_OPEN, 1)[1].split(_CALL_CLOSE, 1)[0].strip()
    calls = [json.loads(line) for line in body.split("\n")]
    if not all(isinstance(c, dict) for c in calls):
        raise ValueError("a tool call is not a JSON object")
    return calls


@lru_cache(maxsize=8)
def _layout(with_call: bool, with_response: bool) -> re.Pattern[str]:
    parts = [r"<think>.*?</think>"]
    if with_call:
        parts.append(r"<tool_call>\n.*?\n</tool_call>")
    if with_response:
        parts.append(r"<response>.*?</response>")
    return re.compile(r"\A" + r"\n".join(parts) + r"\Z", re.S)


def format_reward(gold: str, completion: str) -> float:
    """1 when the completion has the gold answer's layout (think, then the tool-call block if the gold has one,
    then the response if the gold has one, each block once, separated by single newlines), else 0."""
    with_call, with_response = _CALL_OPEN in gold, _RESPONSE_OPEN in gold
    counted = [(_CALL_OPEN, with_call), (_CALL_CLOSE, with_call), (_RESPONSE_OPEN, with_response),
               (_RESPONSE_CLOSE, with_response)]
    if any(flag and completion.count(tag) != 1 for tag, flag in counted):
        return 0.0
    return float(bool(_layout(with_call, with_response).match(completion)))


def correctness_reward(gold: str, completion: str) -> float:
    """0 when the gold answer calls no tool; ``R_min`` when the completion's calls cannot be read; else
    ``tool_call_score``."""
    if _CALL_OPEN not in gold:
        return 0.0
    gold_calls = read_tool_calls(gold)  # a bad gold answer raises: it is a data error, not a low reward
    try:
        predicted = read_tool_calls(completion)
    except ValueError:
        return CORRECT_MIN
    return tool_call_score(gold_calls, predicted)


@VERIFIERS.register(
    "tool_call_match",
    formula="r = R_format + R_correct; R_format = 1 if the layout matches the gold's else 0; R_correct = "
            "6 S / S_max - 3, S = overlap(names) + sum_gold max_same-name-pred (overlap(param names) + #equal "
            "values), S_max = 1 + sum_gold (1 + #params) (3 if identical, -3 if unreadable, 0 if no gold call)",
    paper="Qian et al. 2025, ToolRL: Reward is All Tool Learning Needs (arXiv:2504.13958)",
)
def tool_call_match(task: Task, completion: str) -> RewardResult:
    """ToolRL's reward, ``task.answer`` the gold answer in ToolRL's layout. ``correct``: the layout matches and
    the tool calls equal the gold's (no call when the gold has none); ``answer``: the raw tool-call block."""
    fmt = format_reward(task.answer, completion)
    try:
        correctness = correctness_reward(task.answer, completion)
    except (ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"task {task.id!r}: the gold answer's tool calls cannot be read ({exc})") from exc
    calls_right = correctness == CORRECT_MAX if _CALL_OPEN in task.answer else _CALL_OPEN not in completion
    has_block = _CALL_OPEN in completion and _CALL_CLOSE in completion
    answer = completion.split(_CALL_OPEN, 1)[1].split(_CALL_CLOSE, 1)[0].strip() if has_block else None
    return RewardResult(fmt + correctness, bool(fmt) and calls_right, answer)
