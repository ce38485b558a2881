import sys
from collections import Counter

import pytest

from reinforge.data.reasoning_gym import reasoning_gym_splits
from reinforge.errors import ConfigError
from reinforge.rewards.reasoning_gym import reasoning_gym_score
from reinforge.rewards.verifiers import VERIFIERS
from reinforge.types import Task


@pytest.fixture()
def rg():
    return pytest.importorskip("reasoning_gym", reason="an optional extra: pip install 'reinforge[reasoning-gym]'")

# 2 terms of 1 digit: a small question space, so repeated questions are certain
SMALL_ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _questions(tasks) -> list[str]:
    return [t.metadata["rg_entry"]["question"] for t in tasks]


@pytest.mark.parametrize("name", ["basic_arithmetic", "leg_counting"])
def test_task_by_name_scored_by_its_own_scorer(name, rg):
    s = reasoning_gym_splits(f"reasoning_gym/{name}", size=40, heldout_size=10, seed=7)
    assert len(s.train) == 40 and len(s.heldout) == 10
    ds = rg.create_dataset(name, size=50, seed=7)  # a single task keeps reasoning-gym's own items
    assert _questions(s.heldout) + _questions(s.train) == [ds[i]["question"] for i in range(50)]
    t = s.train[0]
    assert t.prompt == [{"role": "user", "content": ds[10]["question"]}] and t.answer == ds[10]["answer"]
    assert t.metadata["task"] == name and t.metadata["category"] == "arithmetic"
    verifier = VERIFIERS.get("reasoning_gym")
    assert verifier is reasoning_gym_score
    for task in list(s.train[:5]) + list(s.heldout[:5]):
        right = verifier(task, f"<think>easy</think>\n<answer> {task.answer} </answer>")
        assert (right.reward, right.correct, right.answer) == (1.0, True, task.answer)
        wrong = verifier(task, f"<answer>{task.answer}</answer> no, <answer>{int(task.answer) + 1}</answer>")
        assert (wrong.reward, wrong.correct, wrong.answer) == (0.0, False, str(int(task.answer) + 1))
        assert verifier(task, task.answer).reward == 0.0  # no <answer> tags: nothing to score


def test_raw_text_prompts_and_untagged_answers(rg):
    s = reasoning_gym_splits("leg_counting", size=5, heldout_size=1, chat=False, answer_tag=None)
    t = s.train[0]
    assert isinstance(t.prompt, str) and t.prompt == t.metadata["rg_entry"]["question"]
    assert reasoning_gym_score(t, f" {t.answer}\n").correct
    assert not reasoning_gym_score(t, f"<answer>{t.answer}</answer>").correct


def test_splits_never_share_a_question_and_follow_the_seed(rg):
    s = reasoning_gym_splits("basic_arithmetic", size=400, heldout_size=100, seed=3, params=SMALL_ARITH)
    held = _questions(s.heldout)
    assert len(set(held)) == len(held)  # held-out questions are deduplicated ...
    assert not set(held) & set(_questions(s.train))  # ... and never asked in training
    ds = rg.create_dataset("basic_arithmetic", size=500, seed=3, **SMALL_ARITH)
    raw = [ds[i]["question"] for i in range(500)]
    assert len(held) < 100 or len(s.train) < 400, "the small question space should force some repeats"
    assert held == list(dict.fromkeys(raw[:100]))
    assert _questions(s.train) == [q for q in raw[100:] if q not in set(raw[:100])]
    again = reasoning_gym_splits("basic_arithmetic", size=400, heldout_size=100, seed=3, params=SMALL_ARITH)
    assert [t.id for t in again.train] == [t.id for t in s.train]
    other = reasoning_gym_splits("basic_arithmetic", size=400, heldout_size=100, seed=4, params=SMALL_ARITH)
    assert _questions(other.heldout) != held
    t = s.train[0]
    assert t.metadata["rg_params"] == SMALL_ARITH and reasoning_gym_score(t, f"<answer>{t.answer}</answer>").correct


def test_weighted_mixture(rg):
    mix = [{"name": "basic_arithmetic", "weight": 3, "params": SMALL_ARITH}, {"name": "leg_counting", "weight": 1}]
    s = reasoning_gym_splits(mix, size=200, heldout_size=40, seed=1)
    held = Counter(t.metadata["task"] for t in s.heldout)
    train = Counter(t.metadata["task"] for t in s.train)
    assert held["leg_counting"] == 10 and 25 <= held["basic_arithmetic"] <= 30  # 30 before dedupe
    assert train["leg_counting"] == 50 and 130 <= train["basic_arithmetic"] <= 150
    assert not set(_questions(s.heldout)) & set(_questions(s.train))
    assert len({t.id for t in list(s.train) + list(s.heldout)}) == len(s.train) + len(s.heldout)
    for task in list(s.train[:3]) + list(s.train[-3:]):
        assert reasoning_gym_score(task, f"<answer>{task.answer}</answer>").correct
        assert not reasoning_gym_score(task, "<answer>-1</answer>").correct
    same = reasoning_gym_splits(mix, size=200, heldout_size=40, seed=1)
    assert _questions(same.train) == _questions(s.train)


def test_config_errors_name_the_problem(rg):
    with pytest.raises(ConfigError, match=r"unknown task 'leg_countin'; did you mean leg_counting"):
        reasoning_gym_splits("leg_countin", size=5, heldout_size=1)
    with pytest.raises(ConfigError, match=r"'leg_counting': unknown params \['legs'\]; allowed: .*max_animals"):
        reasoning_gym_splits("leg_counting", size=5, heldout_size=1, params={"legs": 3})
    with pytest.raises(ConfigError, match=r"'leg_counting': invalid params .*max_animals must be >= min_animals"):
        reasoning_gym_splits("leg_counting", size=5, heldout_size=1, params={"min_animals": 4, "max_animals": 3})
    with pytest.raises(ConfigError, match="appears twice"):
        reasoning_gym_splits([{"name": "leg_counting"}, {"name": "reasoning_gym/leg_counting"}])
    with pytest.raises(ConfigError, match="weights must be > 0"):
        reasoning_gym_splits([{"name": "leg_counting", "weight": 0}])
    with pytest.raises(ConfigError, match="every training item repeats a held-out question"):
        one = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ("+",),
               "allow_negation": False, "allow_parentheses": False}  # about 100 questions
        reasoning_gym_splits("basic_arithmetic", size=5, heldout_size=2000, params=one)
    with pytest.raises(ValueError, match="not a reasoning-gym task"):
        reasoning_gym_score(Task(id="x", prompt="1+1=", answer="2"), "<answer>2</answer>")


def test_missing_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # makes `import reasoning_gym` fail
    with pytest.raises(ConfigError, match=r"pip install 'reinforge\[reasoning-gym\]'"):
        reasoning_gym_splits("leg_counting", size=5, heldout_size=1)


MALFORMED = ["zzz", "", "-1", "1 2 3", "[[", "A"]


def test_every_registered_task_builds_and_scores_like_its_own_scorer(rg):
    """All of reasoning-gym's tasks by name: items build, a reference answer (where the task has one)
    scores 1, and every answer scores what the task's own ``score_answer`` gives, or 0 where that
    scorer raises on an answer it cannot parse; our verifier never raises on a model's answer."""
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import extract_answer

    names = sorted(set(DATASETS) - {"composite"})
    assert len(names) > 50
    raised_natively = set()
    for name in names:
        native = rg.create_dataset(name, size=1, seed=0)  # default params, like the splits below
        s = reasoning_gym_splits(name, size=2, heldout_size=1, seed=5)
        for task in [*s.heldout, *s.train]:
            entry = task.metadata["rg_entry"]
            assert task.metadata["task"] == name and task.answer == ("" if entry["answer"] is None else str(entry["answer"]))
            for candidate in [task.answer, *MALFORMED]:
                completion = f"<think>x</think><answer>{candidate}</answer>"
                ours = reasoning_gym_score(task, completion)
                try:
                    expected = float(native.score_answer(extract_answer(completion), entry))
                except Exception:
                    raised_natively.add(name)
                    expected = 0.0
                assert ours.reward == pytest.approx(expected), (name, candidate)
                if candidate == task.answer and entry["answer"] is not None:
                    assert ours.correct, (name, candidate)
    assert "prime_factorization" in raised_natively  # the case the fallback is for is exercised


def test_a_scorer_that_cannot_read_its_own_reference_is_an_error(rg, monkeypatch):
    from reinforge.rewards import reasoning_gym as module

    s = reasoning_gym_splits("prime_factorization", size=2, heldout_size=1, seed=5)
    task = s.train[0]
    assert reasoning_gym_score(task, "<answer>zzz</answer>").reward == 0.0  # the scorer raises on "zzz"

    def broken(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setattr(module, "_scorer", lambda name, params: broken)
    with pytest.raises(KeyError, match="metadata"):
        reasoning_gym_score(task, f"<answer>{task.answer}</answer>")


def test_the_composite_dataset_points_to_mixtures(rg):
    with pytest.raises(ConfigError, match=r"give a mixture as a list of tasks \(task.rg_tasks"):
        reasoning_gym_splits("composite", size=5, heldout_size=1)


def test_items_follow_the_seed_even_where_the_task_draws_from_the_global_random(rg):
    """list_functions draws from Python's global ``random`` while generating items; the splits seed it
    (and restore it), so the same seed gives the same questions every time and the caller's global
    stream is left where it was."""
    import random

    random.seed(123)
    expected_next = random.random()
    random.seed(123)
    runs = []
    for _ in range(3):
        runs.append(_questions(reasoning_gym_splits("list_functions", size=12, heldout_size=4, seed=1).train))
        random.random()  # move the global stream between builds
    assert runs[0] == runs[1] == runs[2]
    random.seed(123)
    reasoning_gym_splits("list_functions", size=12, heldout_size=4, seed=1)
    assert random.random() == expected_next
