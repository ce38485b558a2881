"""SWE-RL's patch-similarity reward and ToolRL's tool-call reward against hand-computed values."""

from __future__ import annotations

import pytest

from reinforge.rewards import VERIFIERS
from reinforge.rewards.patch_similarity import patch_similarity_score, unified_diff
from reinforge.rewards.tool_call_match import multiset_overlap, tool_call_score
from reinforge.types import Task

FILES = {"a.py": "x = 1\ny = 2\n"}
ORACLE = {"a.py": "x = 1\ny = 3\n"}


def _patch_task() -> Task:
    return Task("p0", "fix y", "", {"files": FILES, "oracle_files": ORACLE})


def _edit(path: str, search: str, replace: str) -> str:
    return f"```python\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```"


def _solution(*edits: str, thought: str = "y must be 3") -> str:
    return f"<think>{thought}</think><solution>\n" + "\n".join(edits) + "\n</solution>"


def test_patch_similarity_exact_edit_scores_one() -> None:
    result = VERIFIERS.get("patch_similarity")(_patch_task(), _solution(_edit("a.py", "y = 2", "y = 3")))
    assert result.reward == 1.0 and result.correct
    assert result.answer == "### a.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3"


def test_patch_similarity_near_edit_is_difflib_ratio() -> None:
    # diffs "@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 4" and "...+y = 3": 15 + 7 + 7 + 7 = 36 characters each,
    # 35 matching, ratio 2 * 35 / 72
    result = VERIFIERS.get("patch_similarity")(_patch_task(), _solution(_edit("a.py", "y = 2", "y = 4")))
    assert result.reward == pytest.approx(35 / 36) and not result.correct


@pytest.mark.parametrize("completion", [
    "<solution>" + _edit("a.py", "y = 2", "y = 3") + "</solution>",       # no thought block
    _solution(_edit("a.py", "y = 2", "y = 3"), thought="  "),               # empty thought
    _solution(_edit("a.py", "y = 9", "y = 3")),                             # search block not in the file
    _solution(_edit("a.py", "y = 2", "y = 2")),                             # search equals replace
    _solution(_edit("a.py", "y = 2", "y = 3")) + "</solution>",             # a tag twice
])
def test_patch_similarity_format_errors_score_minus_one(completion: str) -> None:
    assert VERIFIERS.get("patch_similarity")(_patch_task(), completion).reward == -1.0


def test_patch_similarity_no_edit_and_extra_file() -> None:
    verifier = VERIFIERS.get("patch_similarity")
    assert verifier(_patch_task(), _solution()).reward == 0.0  # well-formed, changes nothing: 0 for a.py
    # a.py right (1) and a new file b.py the oracle does not touch (0): mean 0.5
    both = _solution(_edit("a.py", "y = 2", "y = 3"), _edit("b.py", "", "z = 0"))
    assert verifier(_patch_task(), both).reward == pytest.approx(0.5)


def test_patch_similarity_score_edge_cases_and_bad_task() -> None:
    assert patch_similarity_score({}, {}) == 1.0
    assert patch_similarity_score({"a": "d"}, {}) == 0.0
    assert unified_diff("same\n", "same\n") == ""
    with pytest.raises(ValueError, match="metadata.oracle_files"):
        VERIFIERS.get("patch_similarity")(Task("t9", "p", "", {"files": FILES}), _solution())


GOLD = ('<think>weather</think>\n<tool_call>\n{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}'
        "\n</tool_call>")


def _call(body: str, think: str = "<think>w</think>\n") -> str:
    return f"{think}<tool_call>\n{body}\n</tool_call>"


def _tool_task(gold: str = GOLD) -> Task:
    return Task("t0", "weather in Paris?", gold)


@pytest.mark.parametrize(("completion", "reward", "correct"), [
    (_call('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}'), 4.0, True),
    # same name, keys equal, one of two values: S = 1 + (1 + 1) = 3, S_max = 1 + (1 + 2) = 4: 6 * 3/4 - 3 = 1.5
    (_call('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "F"}}'), 1.0 + 1.5, False),
    # wrong tool: S = 0: -3, layout right: 1
    (_call('{"name": "get_time", "parameters": {"city": "Paris"}}'), 1.0 - 3.0, False),
    (_call("not json"), 1.0 - 3.0, False),                                  # unreadable call: R_min
    (_call('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "C"}}', think=""), 3.0, False),
    ("<think>w</think>\nno call at all", 0.0 - 3.0, False),
])
def test_tool_call_match_values(completion: str, reward: float, correct: bool) -> None:
    result = VERIFIERS.get("tool_call_match")(_tool_task(), completion)
    assert result.reward == pytest.approx(reward) and result.correct is correct


def test_tool_call_match_response_only_gold() -> None:
    task = _tool_task("<think>a</think>\n<response>hello</response>")
    verifier = VERIFIERS.get("tool_call_match")
    hit = verifier(task, "<think>b</think>\n<response>hi</response>")
    assert (hit.reward, hit.correct) == (1.0, True)  # layout 1, no gold call: R_correct 0
    miss = verifier(task, _call('{"name": "f", "parameters": {}}') + "\n<response>hi</response>")
    assert (miss.reward, miss.correct) == (0.0, False)


def test_tool_call_score_partial_and_overlap() -> None:
    assert multiset_overlap(["a", "a", "b"], ["a", "b", "c"]) == pytest.approx(2 / 4)
    assert multiset_overlap([], ["a"]) == 0.0 and multiset_overlap([], []) == 1.0
    gold = [{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}}]
    # names: 1 / (2 + 1 - 1) = 0.5; f: keys 1 + values 1 = 2; g unmatched: S = 2.5, S_max = 1 + 2 + 1 = 4
    assert tool_call_score(gold, [{"name": "f", "parameters": {"x": 1}}]) == pytest.approx(6 * 2.5 / 4 - 3)
    # a predicted call matches one gold call only: gold f(x=1), f(x=2) against predicted f(x=1), g.
    # names [f, f] vs [f, g]: 1 / (2 + 2 - 1); f(x=1) matched (2); f(x=2) finds its f used and g of another
    # name: 0. S = 1/3 + 2, S_max = 1 + 2 + 2 = 5: 6 * (7/3) / 5 - 3 = -0.2
    two_f = [{"name": "f", "parameters": {"x": 1}}, {"name": "f", "parameters": {"x": 2}}]
    assert tool_call_score(two_f, [{"name": "f", "parameters": {"x": 1}}, {"name": "g"}]) == pytest.approx(-0.2)


def test_tool_call_match_bad_gold_names_the_task() -> None:
    with pytest.raises(ValueError, match="t0"):
        VERIFIERS.get("tool_call_match")(_tool_task("<think>a</think>\n<tool_call>\nnope\n</tool_call>"), "x")
