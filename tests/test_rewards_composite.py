"""Weighted composition of reward terms: the sum, the primary term, params, the error policy, per-step metrics."""

from __future__ import annotations

import logging
import pickle

import pytest

import reinforge.rewards.format  # noqa: F401  (registers think_answer_format)
from reinforge.errors import ConfigError, ReinforgeError
from reinforge.rewards.composite import (
    CompositeReward,
    CompositeRewardResult,
    RewardTerm,
    RewardTermError,
    length_penalty,
    term_metrics,
)
from reinforge.rewards.pool import VerifierError, VerifierPool
from reinforge.rewards.verifiers import RewardResult
from reinforge.types import Task

TASK = Task("t7", "2+2=", "4")
GOOD = "<think>easy</think><answer>4</answer>"


def broken(task: Task, completion: str) -> RewardResult:
    raise RuntimeError("boom")


def half(task: Task, completion: str) -> RewardResult:
    return RewardResult(0.5, False, "h")


def test_weighted_sum_raw_terms_and_primary():
    reward = CompositeReward([
        RewardTerm("format", "think_answer_format", 0.2),
        RewardTerm("correct", "numeric_match", 1.0, primary=True),
        RewardTerm("half", half, -2.0),
    ])
    result = reward(TASK, GOOD)
    assert isinstance(result, CompositeRewardResult)
    assert result.terms == {"format": 1.0, "correct": 1.0, "half": 0.5}
    assert result.reward == pytest.approx(0.2 * 1.0 + 1.0 * 1.0 - 2.0 * 0.5)
    assert result.correct and result.answer == "4"  # from the primary term, not the first
    wrong = reward(TASK, "<think>x</think><answer>5</answer>")
    assert wrong.reward == pytest.approx(0.2 - 1.0) and not wrong.correct and wrong.answer == "5"


def test_first_term_is_primary_by_default():
    reward = CompositeReward([RewardTerm("half", half), RewardTerm("correct", "numeric_match")])
    result = reward(TASK, "4")
    assert not result.correct and result.answer == "h"


def test_params_are_laid_over_the_task_metadata_for_that_term_only():
    seen = []

    def spy(task: Task, completion: str) -> RewardResult:
        seen.append(dict(task.metadata))
        return RewardResult(0.0, False)

    task = Task("t", "p", "a", {"max_len": 1, "keep": True})
    reward = CompositeReward([RewardTerm("len", "length_penalty", params={"max_len": 10, "target": 5}),
                              RewardTerm("spy", spy)])
    assert reward(task, "x" * 8).terms["len"] == pytest.approx(-(8 - 5) / (10 - 5))
    assert seen == [{"max_len": 1, "keep": True}] and task.metadata == {"max_len": 1, "keep": True}


def test_on_error_raise_names_the_term_task_and_completion():
    reward = CompositeReward([RewardTerm("correct", "numeric_match"), RewardTerm("judge", broken)])
    with pytest.raises(RewardTermError, match=r"'judge' failed on task 't7': RuntimeError: boom; completion: 'xx") as e:
        reward(TASK, "x" * 2000)
    assert isinstance(e.value, ReinforgeError) and isinstance(e.value.__cause__, RuntimeError)
    assert len(str(e.value)) < 800  # the completion is truncated
    assert reward.error_counts == {"correct": 0, "judge": 1}


def test_on_error_zero_scores_zero_records_and_warns_once(caplog):
    reward = CompositeReward([RewardTerm("correct", "numeric_match"), RewardTerm("judge", broken, 3.0)],
                             on_error="zero")
    with caplog.at_level(logging.WARNING, logger="reinforge.rewards.composite"):
        results = [reward(TASK, c) for c in ("4", "5", "4")]
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert results[0].terms == {"correct": 1.0, "judge": 0.0}
    assert results[0].errors == {"judge": "RuntimeError: boom"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'judge'" in warnings[0].getMessage() and "t7" in warnings[0].getMessage()
    assert reward.error_counts == {"correct": 0, "judge": 3}


@pytest.mark.parametrize("bad", [lambda t, c: 1.0, lambda t, c: RewardResult(float("nan"), False)])
def test_a_term_must_return_a_finite_reward_result(bad):
    with pytest.raises(RewardTermError, match="'bad'"):
        CompositeReward([RewardTerm("bad", bad)])(TASK, "4")


def test_a_failing_primary_term_is_not_correct():
    result = CompositeReward([RewardTerm("b", broken), RewardTerm("n", "numeric_match")], on_error="zero")(TASK, "4")
    assert result.reward == 1.0 and not result.correct and result.answer is None


@pytest.mark.parametrize(("terms", "on_error", "message"), [
    ([], "raise", "at least one term"),
    ([RewardTerm("a", half), RewardTerm("a", half)], "raise", "unique"),
    ([RewardTerm("errors", half)], "raise", "not 'errors'"),
    ([RewardTerm("a/b", half)], "raise", "without '/'"),
    ([RewardTerm("a", half, float("inf"))], "raise", "finite"),
    ([RewardTerm("a", half, primary=True), RewardTerm("b", half, primary=True)], "raise", "at most one"),
    ([RewardTerm("a", "no_such_verifier")], "raise", "unknown verifier 'no_such_verifier'"),
    ([RewardTerm("a", 3)], "raise", "registered name or a callable"),
    ([RewardTerm("a", half)], "ignore", "on_error must be"),
])
def test_bad_composition_fails_at_construction(terms, on_error, message):
    with pytest.raises(ConfigError, match=message):
        CompositeReward(terms, on_error=on_error)


def test_term_metrics_means_and_error_counts():
    reward = CompositeReward([RewardTerm("correct", "numeric_match"), RewardTerm("judge", broken)], on_error="zero")
    results = [reward(TASK, c) for c in ("4", "5", "4", "4")] + [None, RewardResult(1.0, True)]
    assert term_metrics(results) == {
        "reward/correct": 0.75, "reward/judge": 0.0, "reward/errors/correct": 0.0, "reward/errors/judge": 4.0,
    }
    assert term_metrics([]) == {}


def test_composite_pickles_and_runs_in_the_verifier_pool():
    reward = pickle.loads(pickle.dumps(CompositeReward([RewardTerm("correct", "numeric_match")])))
    with VerifierPool(reward, workers=2, timeout_s=10) as pool:
        outcomes = pool.score([TASK, TASK], ["4", "3"])
    assert [o.reward for o in outcomes] == [1.0, 0.0] and outcomes[0].result.terms == {"correct": 1.0}
    with VerifierPool(CompositeReward([RewardTerm("b", broken)]), timeout_s=10) as pool:
        with pytest.raises(VerifierError, match="RewardTermError: reward term 'b'"):
            pool.score([TASK], ["4"])


# --- length_penalty -----------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "expected"), [(0, 0.0), (60, 0.0), (70, -0.25), (100, -1.0), (101, -1.0)])
def test_length_penalty_ramp(n, expected):
    result = length_penalty(Task("t", "p", "a", {"max_len": 100, "target": 60}), "x" * n)
    assert result.reward == pytest.approx(expected) and result.correct == (n <= 100)


def test_length_penalty_hard_cutoff_words_and_errors():
    assert length_penalty(Task("t", "p", "a", {"max_len": 3}), "abc").reward == 0.0
    assert length_penalty(Task("t", "p", "a", {"max_len": 3}), "abcd").reward == -1.0
    words = Task("t", "p", "a", {"max_len": 4, "target": 2, "length_unit": "words"})
    assert length_penalty(words, "one two three").reward == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="needs max_len"):
        length_penalty(Task("t", "p", "a"), "x")
    with pytest.raises(ValueError, match="target <= max_len"):
        length_penalty(Task("t", "p", "a", {"max_len": 3, "target": 5}), "x")
    with pytest.raises(ValueError, match="length_unit"):
        length_penalty(Task("t", "p", "a", {"max_len": 3, "length_unit": "tokens"}), "x")
