"""Majority voting and the evaluation result on hand-made cases."""

import numpy as np
import pytest

from reinforge.eval.heldout import _breakdown, majority_correct
from reinforge.rewards.verifiers import exact_match, numeric_match
from reinforge.types import Task


def test_majority_vote_hand_cases():
    correct = np.array([[1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0]])
    answers = [["7", "5", "5", "7"], ["3", "3", "4", "4"], [None, None, "9", "9"]]
    # k=1: first sample; k=3: prompt 0 votes 5 (wrong), prompt 1 votes 3 (wrong); k=4: ties -> first seen
    assert majority_correct(correct, answers, 1).tolist() == [1, 0, 0]
    assert majority_correct(correct, answers, 3).tolist() == [0, 0, 0]
    assert majority_correct(correct, answers, 4).tolist() == [1, 0, 0]
    assert majority_correct(correct, [[None] * 4] * 3, 4).tolist() == [0, 0, 0]  # nothing ended: wrong


def test_verifiers_expose_the_answer_they_read():
    task = Task("t", "1/2+1/4=", "3/4")
    assert numeric_match(task, "so it is 6/8").answer == "3/4" and numeric_match(task, "6/8").correct
    assert exact_match(Task("t", "x", "42"), " 42 \n").answer == "42"


def test_breakdown_by_metadata():
    tasks = [Task(str(i), "p", "a", {"difficulty": "easy" if i < 2 else "hard"}) for i in range(4)]
    out = _breakdown(tasks, {"greedy_accuracy": np.array([1.0, 0.0, 1.0, 1.0])})
    assert out == {"difficulty": {"easy": {"prompts": 2.0, "greedy_accuracy": 0.5},
                                  "hard": {"prompts": 2.0, "greedy_accuracy": 1.0}}}
    assert _breakdown(tasks[:1], {"greedy_accuracy": np.array([1.0])}) == {}


@pytest.mark.slow
def test_evaluate_with_intervals_on_the_tiny_model(tiny_model, tiny_tokenizer):
    from reinforge.data.arithmetic import arithmetic_splits
    from reinforge.eval.heldout import evaluate
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    engine = TorchRolloutEngine(tiny_model, tiny_tokenizer, seed=0)
    tasks = list(arithmetic_splits().heldout)[:80]
    r = evaluate(engine, tasks, exact_match, 8, samples=8, ks=(1, 8), confidence=True, n_boot=500)
    assert set(r.pass_at_k) == {1, 8} and len(r.pass_curve) == 8
    assert r.pass_curve[1] == pytest.approx(r.mean_at_n)
    assert all(r.pass_curve[k] <= r.pass_curve[k + 1] + 1e-12 for k in range(1, 8))
    lo, hi = r.intervals["pass@8"]
    assert lo <= r.pass_at_k[8] <= hi and hi - lo < 0.3
