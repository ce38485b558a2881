"""benchmarks/bench_classic.py's pure parts: the per-seed ratios, the run directories `reinforge compare`
reads, the children's running window (returns or success rates) and the table of tasks and recipes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_classic  # noqa: E402
import cleanrl_loops  # noqa: E402
from classic_impls import CHILDREN, IMPL_TASK, PRELUDE, RECIPES, TASKS, THROUGHPUT, child  # noqa: E402


def test_ratios_pair_each_seed_with_the_same_seed():
    results = [{"impl": "a", "seed": 0, "wall_s": 2.0}, {"impl": "b", "seed": 0, "wall_s": 4.0},
               {"impl": "a", "seed": 1, "wall_s": 9.0}, {"impl": "b", "seed": 1, "wall_s": 3.0},
               {"impl": "a", "seed": 2, "wall_s": 1.0}]  # seed 2 of b did not run: left out
    assert bench_classic.ratios(results, "a", "b", "wall_s") == "1.75 (0.50-3.00, n=2)"
    assert bench_classic.ratios(results, "a", "c", "wall_s") == "-"


def test_a_run_directory_is_read_by_reinforge_compare(tmp_path):
    from reinforge.eval.compare import run_compare

    runs = [{"impl": "x", "seed": s, "steps": 100 * (s + 1), "wall_s": 1.0, "steps_per_s": 5.0, "reached": True}
            for s in range(2)]
    paths = [bench_classic.write_run(tmp_path, r) for r in runs]
    assert json.loads((paths[1] / "metrics.jsonl").read_text())["bench/env_steps_to_threshold"] == 200
    table = run_compare([f"x={paths[0]},{paths[1]}"], "bench/env_steps_to_threshold", n_boot=10)
    assert "| x | 2 | 150.000" in table


def _prelude(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setattr(sys, "argv", ["-c", *argv])
    space: dict = {}
    exec(PRELUDE, space)  # noqa: S102 - the benchmark's own child prelude
    space["state"]["t0"] = 0.0
    return space


def test_the_window_of_returns_reaches_the_threshold_at_the_right_step(monkeypatch):
    child = _prelude(["x", "0", "10", "2", "100", "none"], monkeypatch)
    assert not child["seen"]([5.0], 4)  # one episode: the window of 2 is not full
    assert not child["seen"]([14.0], 8)  # mean 9.5 < 10
    assert child["seen"]([7.0, 13.0], 12)  # window [7, 13]: mean 10
    assert child["state"]["reached"][0] == 12
    assert child["seen"]([0.0], 16) and child["state"]["reached"][0] == 12  # the first crossing is kept


def test_with_success_above_the_window_holds_success_rates(monkeypatch):
    child = _prelude(["x", "0", "0.6", "3", "100", "-10.0"], monkeypatch)
    assert not child["seen"]([-10.0, -3.0, -10.0], 30)  # bit flipping: -10 is a failure of 10 steps; 1/3
    assert child["recent"] == [0.0, 1.0, 0.0]
    assert child["seen"]([-0.0, -9.0], 40)  # [0, 1, 1]: 2/3 >= 0.6
    assert child["state"]["reached"][0] == 40


def test_every_implementation_has_a_task_a_child_and_reinforge_a_recipe_that_loads():
    from reinforge.classic.config import load_classic_config

    assert set(IMPL_TASK.values()) == set(TASKS) == set(THROUGHPUT)
    for impl, task in IMPL_TASK.items():
        assert impl.split("-")[0] in CHILDREN, impl
        assert len(TASKS[task]) == 5
    for impl, (recipe, overrides) in RECIPES.items():
        assert impl in IMPL_TASK, impl
        c = load_classic_config(recipe, ["seed=0", *overrides]).classic
        assert c.train.total_env_steps >= TASKS[IMPL_TASK[impl]][3], impl  # the schedules span the cap
    assert {a for pair in bench_classic.PAIRS for a in pair} <= set(IMPL_TASK)


def test_each_implementation_runs_its_own_loop_else_its_familys():
    assert child("cleanrl-dqn") is child("cleanrl-dqn256") is cleanrl_loops.DQN and child("cleanrl-sac") is cleanrl_loops.SAC
    assert child("cleanrl-ppo") is CHILDREN["cleanrl"]  # CleanRL's PPO loop
    assert child("reinforge-sac") is CHILDREN["reinforge"] and child("sb3-dqn") is CHILDREN["sb3"]
    assert IMPL_TASK["cleanrl-dqn"] == IMPL_TASK["reinforge-dqn"] == "cartpole-dqn"
    assert IMPL_TASK["cleanrl-sac"] == IMPL_TASK["reinforge-sac"] == "pendulum-sac"
    for impl in IMPL_TASK:
        compile(PRELUDE + child(impl), impl, "exec")  # every child is valid Python
