"""Knapsack RL budgets (issue 18): the value, the exact knapsack, the authors' fallback, per-prompt group sizes.

Hand-solved knapsacks are worked out in the comments; larger ones are checked against enumeration."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from reinforge.config import load_config
from reinforge.data.budgets import (
    KnapsackBudget,
    KnapsackSettings,
    build_budget,
    fallback,
    reserved_samples,
    solve_knapsack,
    task_value,
)
from reinforge.errors import ConfigError
from reinforge.orchestrate.batch_sources import collect_sized
from reinforge.orchestrate.collectors import Collected
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task, Trajectory


def test_task_value_by_hand():
    # p = 0.5, N = 2: (1 - 0.25 - 0.25) * 0.5 * 0.25 = 0.0625
    assert math.isclose(float(task_value(np.array([2]), 0.5)[0]), 0.0625)
    # p = 0.25, N = 4: (1 - 1/256 - 81/256) * 0.25 * 0.5625 = (174/256) * 0.140625
    assert math.isclose(float(task_value(np.array([4]), 0.25)[0]), 174 / 256 * 0.140625)
    assert task_value(np.array([1, 8]), 0.0).tolist() == [0.0, 0.0] == task_value(np.array([1, 8]), 1.0).tolist()
    v = task_value(np.arange(1, 50), 0.05)
    assert v[0] == 0 and np.all(np.diff(v) > 0)  # one sample never has a spread; more samples always help


def test_a_hand_solved_knapsack():
    values = np.array([[0.0, 5.0, 6.0], [0.0, 3.0, 7.0]])  # item i with 1, 2, 3 samples
    # budget 4 (2 beyond the minimum): (2, 2) = 5 + 3 = 8 beats (3, 1) = 6 and (1, 3) = 7
    assert solve_knapsack(values, 1, 4) == [2, 2]
    # budget 5: (2, 3) = 5 + 7 = 12 beats (3, 2) = 9
    assert solve_knapsack(values, 1, 5) == [2, 3]
    # budget 9 > what helps (3 + 3): the least budget spent; budget 2: the minimum each
    assert solve_knapsack(values, 1, 9) == [3, 3] and solve_knapsack(values, 1, 2) == [1, 1]
    with pytest.raises(ValueError, match="cannot give 2 prompts 2 each"):
        solve_knapsack(values, 2, 3)


@pytest.mark.parametrize("seed", range(6))
def test_the_knapsack_is_optimal_against_enumeration(seed):
    rng = np.random.default_rng(seed)
    p = rng.choice([0.05, 0.2, 0.5, 0.8, 0.95], size=4)
    low, high, budget = 2, 7, int(rng.integers(8, 25))
    n = np.arange(low, high + 1)
    values = np.stack([task_value(n, float(x)) for x in p])
    sizes = solve_knapsack(values, low, budget)
    best = max(sum(values[i, s - low] for i, s in enumerate(c))
               for c in itertools.product(n, repeat=4) if sum(c) <= budget)
    assert sum(sizes) <= budget and all(low <= s <= high for s in sizes)
    assert math.isclose(sum(values[i, s - low] for i, s in enumerate(sizes)), best, rel_tol=1e-12)


def test_reserved_samples_by_hand():
    # alpha = 0.9: floor(ln 0.1 / ln max(p, 1 - p)); ln 0.1 = -2.302585
    assert reserved_samples(0.5, 128, 0.9) == 3  # / ln 0.5 = -0.693147: 3.32
    assert reserved_samples(0.25, 128, 0.9) == reserved_samples(0.75, 128, 0.9) == 8  # / ln 0.75 = -0.287682: 8.004
    assert reserved_samples(0.9, 128, 0.9) == 21  # / ln 0.9 = -0.105361: 21.85
    assert reserved_samples(0.01, 128, 0.9) == 128 and reserved_samples(0.01, 16, 0.9) == 16  # 229.1, capped at N_up
    assert reserved_samples(0.5, 128, 0.99) == 6  # ln 0.01 / ln 0.5 = 6.64


def test_fallback_follows_the_authors_rule():
    cfg = KnapsackSettings(min_per_prompt=2, max_per_prompt=16)
    # 26 left beyond [2, 2, 2, 8]; p = 0.5 is reserved 3, the other 23 go to the unsolved prompt (no cap)
    sizes = [2, 2, 2, 8]
    assert fallback(sizes, [0.5, 0.0, 1.0, None], 40, cfg) == (3, 23) and sizes == [2, 25, 2, 8]
    # no unsolved prompt: the 8 - 3 = 5 go evenly to every prompt outside the knapsack, unseen included (3, 2)
    sizes = [2, 2, 8]
    assert fallback(sizes, [0.5, 1.0, None], 20, cfg) == (3, 5) and sizes == [2, 5, 10]
    # reserves 8 + 8 = 16 >= 14 left: no fallback, the knapsack divides all 14
    sizes = [2, 2, 2]
    assert fallback(sizes, [0.25, 0.75, 0.0], 20, cfg) == (14, 0) and sizes == [2, 2, 2]
    # nothing to value: what is left (7) to the unsolved prompts, 4 + 3; with none of them, the uniform split
    sizes = [2, 2, 2]
    assert fallback(sizes, [0.0, 0.0, 1.0], 13, cfg) == (0, 7) and sizes == [6, 5, 2]
    sizes = [2, 8]
    assert fallback(sizes, [1.0, None], 16, cfg) == (0, 6) and sizes == [8, 8]  # 16 - 10 = 6 handed out
    # switched off: the knapsack gets everything that is left
    sizes = [2, 2, 2, 8]
    off = KnapsackSettings(min_per_prompt=2, max_per_prompt=16, fallback=False)
    assert fallback(sizes, [0.5, 0.0, 1.0, None], 40, off) == (26, 0) and sizes == [2, 2, 2, 8]


def tasks(*ids: str) -> list[Task]:
    return [Task(id=i, prompt=f"{i}=", answer="0") for i in ids]


def observe(budget, outcomes: dict[str, list[int]]) -> None:
    budget.observe([Trajectory([1, 2], [0, 1], [0.0, -0.5], 0, g, tid, reward=float(o), metadata={"correct": bool(o)})
                    for g, (tid, os) in enumerate(outcomes.items()) for o in os])


def test_allocation_sums_to_the_budget_keeps_the_minimum_and_resumes():
    b = KnapsackBudget(KnapsackSettings(min_per_prompt=2, max_per_prompt=16))
    ts = tasks("easy", "hard", "mid", "solved", "new")
    assert b.allocate(ts, 8) == [8] * 5  # nothing observed: the uniform allocation
    observe(b, {"easy": [1, 1, 1, 0], "hard": [1, 0, 0, 0], "mid": [1, 0, 1, 0], "solved": [1, 1, 1, 1]})
    sizes = b.allocate(ts, 8)
    # B = 40; 2 each for the 4 seen prompts and 8 for the new one leave 24. Reserves: easy and hard
    # (p = 0.75, 0.25) 8 each, mid (0.5) 3: 19 < 24, so the 5 others go to the prompts outside the knapsack
    # (no unsolved one): solved 2 + 3, new 8 + 2; the knapsack divides 3 x 2 + 19 = 25 over the three
    assert sum(sizes) == 40 and sizes[3:] == [5, 10] and b.metrics()["budget/fallback_samples"] == 5
    n = np.arange(2, 17)
    p = [0.75, 0.25, 0.5]
    best = max((c for c in itertools.product(n, repeat=3) if sum(c) <= 25),
               key=lambda c: (round(sum(float(task_value(np.array([s]), q)[0]) for s, q in zip(c, p, strict=True)), 12),
                              -sum(c)))
    assert sum(sizes[:3]) == 25 and sizes[:3] == list(best)
    assert math.isclose(b.metrics()["budget/value"],
                        sum(float(task_value(np.array([s]), q)[0]) for s, q in zip(best, p, strict=True)),
                        rel_tol=1e-9)
    assert sizes[1] > sizes[0]  # p(1 - p)^2 favours the hard prompt (0.14) over the easy one (0.047)
    assert b.metrics()["budget/valued_prompts"] == 3 and b.metrics()["budget/hist/10"] == 1
    again = KnapsackBudget(KnapsackSettings(min_per_prompt=2, max_per_prompt=16))
    again.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert again.allocate(ts, 8) == sizes
    observe(b, {"hard": [0] * 6})
    assert b.rate("hard") == 0.0 and b.stats.get("hard").success_rate == 0.1  # last group vs all 10 samples
    # now hard is unsolved: reserves 8 + 3 = 11 of 24, and the other 13 all go to it
    sizes = b.allocate(ts, 8)
    assert sizes[1] == 2 + 13 and sizes[3:] == [2, 8] and sum(sizes) == 40


def test_budget_settings_are_checked():
    with pytest.raises(ConfigError, match="max_per_prompt"):
        load_config(None, ["rollout.budget={name: knapsack, min_per_prompt: 4, max_per_prompt: 3}"])
    with pytest.raises(ConfigError, match="rollout budget"):
        load_config(None, ["rollout.budget={name: greedy}"])
    with pytest.raises(ValueError, match="total=6"):
        b = KnapsackBudget(KnapsackSettings(total=6))
        observe(b, {"a": [1, 0]})
        b.allocate(tasks("a", "b", "c"), 4)
    assert build_budget("uniform").allocate(tasks("a", "b"), 3) == [3, 3]


class FakeCollector:
    """Scores sample j of task i as i + j / 10; records each call's tasks and n."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], int]] = []

    def collect(self, ts, params, seed, group_offset=0, independent=False):
        self.calls.append(([t.id for t in ts], params.n))
        return Collected([Trajectory([1], [1], [0.0], 0, group_offset + i, t.id, reward=float(j))
                          for i, t in enumerate(ts) for j in range(params.n)], reward_s=0.5)


def test_collect_sized_samples_each_prompt_its_own_group_size():
    c, ts = FakeCollector(), tasks("a", "b", "c")
    got = collect_sized(c, ts, SamplingParams(n=2), 0, 10, [3, 1, 3])
    assert c.calls == [(["b"], 1), (["a", "c"], 3)]  # one collection per size, in increasing size
    assert [(t.task_id, t.group_id, t.reward) for t in got.trajectories] == [
        ("a", 10, 0.0), ("a", 10, 1.0), ("a", 10, 2.0), ("b", 11, 0.0), ("c", 12, 0.0), ("c", 12, 1.0), ("c", 12, 2.0)]
    assert got.reward_s == 1.0
    c2 = FakeCollector()
    collect_sized(c2, ts, SamplingParams(n=2), 0, 10, [2, 2, 2])
    assert c2.calls == [(["a", "b", "c"], 2)]  # every size the group size: the plain collection
