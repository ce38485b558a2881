import json

import pytest

from reinforge.data.arithmetic import arithmetic_splits, column_carries
from reinforge.data.base import TaskSampler
from reinforge.data.jsonl import jsonl_splits, read_jsonl_tasks
from reinforge.errors import DataError
from reinforge.rewards.verifiers import exact_match, numeric_match


def test_arithmetic_splits_are_disjoint_seeded_and_correct():
    s = arithmetic_splits(digits=2, ops="+-", heldout_size=300, seed=5)
    assert len(s.heldout) == 300 and len(s.train) == 2 * 10_000 - 300
    held = {t.id for t in s.heldout}
    assert not held & {t.id for t in s.train}
    assert [t.id for t in arithmetic_splits(2, "+-", 300, 5).heldout] == [t.id for t in s.heldout]
    for t in list(s.heldout)[:50]:
        m = t.metadata
        assert int(t.answer) == (m["a"] + m["b"] if m["op"] == "+" else m["a"] - m["b"])
        assert t.prompt[0]["content"] == f"{m['a']}{m['op']}{m['b']}="


@pytest.mark.parametrize(("a", "b", "op", "carries"), [
    (23, 45, "+", 0), (27, 45, "+", 1), (99, 1, "+", 2), (999, 1, "+", 3), (0, 0, "+", 0), (95, 5, "+", 2),
    (45, 23, "-", 0), (50, 7, "-", 1), (7, 50, "-", 1), (100, 1, "-", 2), (91, 19, "-", 1), (1000, 1, "-", 3),
])
def test_arithmetic_difficulty_counts_column_carries_and_borrows(a, b, op, carries):
    assert column_carries(a, b, op) == carries


def test_arithmetic_tasks_carry_their_difficulty():
    tasks = list(arithmetic_splits(digits=2, ops="+", heldout_size=500, seed=1).heldout)
    by = {d: sum(t.metadata["difficulty"] == d for t in tasks) for d in (0, 1, 2)}
    assert sum(by.values()) == 500 and all(by.values())  # every level occurs in a 500-problem split
    t = next(t for t in tasks if t.metadata["difficulty"] == 0)
    assert all(int(x) + int(y) < 10 for x, y in zip(f"{t.metadata['a']:02d}", f"{t.metadata['b']:02d}", strict=True))


def test_sampler_is_deterministic_and_resumable():
    s = arithmetic_splits(digits=1, heldout_size=10)
    a = TaskSampler(s.train, seed=3)
    first = [t.id for t in a.next_batch(50)]  # crosses several epochs of 90 tasks? no: 50 < 90
    state = a.state_dict()
    rest = [t.id for t in a.next_batch(200)]
    b = TaskSampler(s.train, seed=3)
    b.load_state_dict(state)
    assert [t.id for t in b.next_batch(200)] == rest
    assert [t.id for t in TaskSampler(s.train, seed=3).next_batch(50)] == first
    epoch = rest[40:130]  # the second epoch is a permutation of the whole split
    assert sorted(epoch) == sorted(t.id for t in s.train)


def test_jsonl_reader_and_errors(tmp_path):
    good = tmp_path / "d.jsonl"
    rows = [{"prompt": f"{i}+1=", "answer": i + 1, "level": 1} for i in range(10)]
    rows.append({"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"})
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = read_jsonl_tasks(good)
    assert len(tasks) == 11 and tasks[3].answer == "4" and tasks[0].metadata == {"level": 1}
    splits = jsonl_splits(good, heldout_size=3, seed=0)
    assert len(splits.heldout) == 3 and not {t.id for t in splits.heldout} & {t.id for t in splits.train}

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a"\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        read_jsonl_tasks(bad)
    bad.write_text('{"prompt": "a", "answer": "b"}\n{"prompt": "a"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing column 'answer'"):
        read_jsonl_tasks(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="empty"):
        read_jsonl_tasks(empty)
    with pytest.raises(DataError, match="no such file"):
        read_jsonl_tasks(tmp_path / "missing.jsonl")


def test_verifiers():
    from reinforge.types import Task

    t = Task(id="x", prompt="1+1=", answer="2")
    assert exact_match(t, " 2 ").reward == 1.0
    assert exact_match(t, "22").reward == 0.0
    assert numeric_match(t, "the answer is 2.0").reward == 1.0
    assert numeric_match(Task(id="y", prompt="", answer="1/2"), "0.5").correct
    assert numeric_match(t, "none").reward == 0.0
