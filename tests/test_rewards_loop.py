"""The reward path of the training loop: verifiers scored in the VerifierPool, the error policy
(auto = stop on a failure in the first step, count and zero after it), failures logged with their
samples, and process workers giving the same rewards as threads."""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest

from reinforge.config import load_config
from reinforge.orchestrate.run import train
from reinforge.rewards.pool import VerifierError
from reinforge.rewards.verifiers import VERIFIERS, RewardResult, numeric_match
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task

STEP_CALLS = 8  # prompts_per_step x group_size below
EVAL_CALLS = 4  # the greedy held-out evaluation before training (task.heldout_size)
COMMON = ["train.steps=2", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "rollout.prompts_per_step=2",
          "rollout.group_size=4", "train.time_limit_s=0", "task.heldout_size=4", "log.report=false"]


class _Flaky:
    """numeric_match that raises on every 3rd call from call ``start`` on (counts across threads)."""

    def __init__(self) -> None:
        self.calls, self.start, self.lock = 0, 0, threading.Lock()

    def __call__(self, task: Task, completion: str) -> RewardResult:
        with self.lock:
            self.calls += 1
            n = self.calls
        if n > self.start and n % 3 == 0:
            raise RuntimeError(f"flaky reward on call {n}")
        return numeric_match(task, completion)


FLAKY = _Flaky()
if "_test_flaky" not in VERIFIERS:
    VERIFIERS.register("_test_flaky", formula="numeric_match, raising on every 3rd call", paper="-")(FLAKY)


def _train(tmp_path, *overrides):
    return train(load_config(None, [f"output_dir={tmp_path}", *COMMON, *overrides]))


def test_auto_policy_stops_on_a_failure_in_the_first_step(tmp_path):
    FLAKY.calls, FLAKY.start = 0, 0
    with pytest.raises(VerifierError, match=r"RuntimeError: flaky reward on call \d+; completion: '"):
        _train(tmp_path, "task.verifier=_test_flaky")


def test_auto_policy_counts_and_logs_failures_after_the_first_step(tmp_path):
    FLAKY.calls, FLAKY.start = 0, EVAL_CALLS + STEP_CALLS  # the first eval's and step's calls all succeed
    result = _train(tmp_path, "task.verifier=_test_flaky")
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["reward/failed_calls"] for m in rows] == [0.0, 2.0]  # step 2 makes calls 13..20: 15 and 18 raise
    assert all(m["memory/peak_mb"] > 100 for m in rows)  # the step's peak resident set (a model is loaded)
    failures = read_jsonl(result.run_dir / "reward_failures.jsonl")
    assert len(failures) == 2 and all(f["step"] == 2 and f["term"] == "*" for f in failures)
    assert all("flaky reward on call" in f["error"] and "completion" in f for f in failures)


def test_raise_policy_and_zero_policy(tmp_path):
    FLAKY.calls, FLAKY.start = 0, EVAL_CALLS + STEP_CALLS
    with pytest.raises(VerifierError):  # raise: also after the first step
        _train(tmp_path / "r", "task.verifier=_test_flaky", "reward.on_error=raise")
    FLAKY.calls, FLAKY.start = 0, 0
    result = _train(tmp_path / "z", "task.verifier=_test_flaky", "reward.on_error=zero")  # zero: also in step 1
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [m["reward/failed_calls"] for m in rows] == [3.0, 2.0]  # calls 5..12 and 13..20


def test_composite_term_errors_are_logged_per_term(tmp_path):
    terms = ("reward.terms=[{name: ok, verifier: numeric_match, primary: true}, "
             "{name: len, verifier: length_penalty, weight: 0.5}]")  # len lacks its max_len param: it raises
    with pytest.raises(VerifierError, match="reward term 'len' failed"):
        _train(tmp_path / "auto", terms)
    result = _train(tmp_path / "zero", terms, "reward.on_error=zero")
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [(m["reward/errors/len"], m["reward/errors/ok"], m["reward/failed_calls"]) for m in rows] == [
        (STEP_CALLS, 0.0, 0.0)] * 2
    failures = read_jsonl(result.run_dir / "reward_failures.jsonl")
    assert len(failures) == 2 * STEP_CALLS and {f["term"] for f in failures} == {"len"}
    assert "needs max_len" in failures[0]["error"]


def test_process_workers_score_like_threads(tmp_path):
    runs = {kind: _train(tmp_path / kind, f"reward.pool={kind}", "train.steps=1") for kind in ("thread", "process")}
    rewards = {kind: [m["reward/mean"] for m in read_jsonl(r.run_dir / "metrics.jsonl") if "reward/mean" in m]
               for kind, r in runs.items()}
    assert rewards["thread"] == rewards["process"] and len(rewards["thread"]) == 1


WHERE_SCORED = """
import multiprocessing
import os

from reinforge.rewards.verifiers import numeric_match


def score(task, completion):
    with open(os.environ["REINFORGE_TEST_SCORED_IN"], "a") as f:
        f.write(f"{multiprocessing.current_process().name} {os.getppid()}\\n")
    return numeric_match(task, completion)
"""


@pytest.mark.slow
def test_an_async_rollout_worker_scores_in_process_workers(tmp_path, monkeypatch):
    """Async rollout workers are daemonic processes, which multiprocessing forbids children by
    default; the pool still starts its verifier processes there, each imports the user's reward
    file itself, and the run trains on their scores."""
    log = tmp_path / "scored_in.txt"
    monkeypatch.setenv("REINFORGE_TEST_SCORED_IN", str(log))
    (tmp_path / "where.py").write_text(WHERE_SCORED)
    result = _train(tmp_path / "run", "orchestrate.mode=async", "reward.pool=process",
                    f"task.verifier={tmp_path / 'where.py'}:score")
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert len(rows) == 2
    calls = [line.split() for line in log.read_text().splitlines()]
    assert {name for name, _ in calls} == {"reinforge-verifier"}  # every call in a verifier process
    by_parent = Counter(parent for _, parent in calls)
    learner = str(os.getpid())  # the learner is this process: its pool scores the greedy held-out evaluations
    assert by_parent.pop(learner) == 2 * EVAL_CALLS  # before and after training
    (worker_calls,) = by_parent.values()  # the rollout worker's pool: every training sample
    assert worker_calls >= 2 * STEP_CALLS and worker_calls % STEP_CALLS == 0  # (plus any batch it ran ahead)


@pytest.mark.parametrize(("overrides", "kind"), [
    ([], "thread"),  # exact_match: a string comparison gains nothing from a process
    (["task.verifier=math_verify"], "process"),
    (["task.verifier=reasoning_gym"], "process"),
    (["task.verifier=math_verify", "reward.pool=thread"], "thread"),
    (["task.verifier=exact_match", "reward.pool=process"], "process"),
    (["reward.terms=[{name: m, verifier: math_verify}, {name: f, verifier: think_answer_format, weight: 0.1}]"], "process"),
    (["reward.terms=[{name: m, verifier: math_verify}, {name: rm, reward_model: {path: rm}}]"], "thread"),
    (["task.verifier=code_tests"], "thread"),
    (["task.verifier=math_verify", "env.name=calculator"], "thread"),
])
def test_auto_pool_picks_processes_for_cpu_bound_verifiers(overrides, kind):
    from reinforge.rewards.build import pool_kind

    cfg = load_config(None, overrides)
    assert pool_kind(cfg.reward, cfg.task.verifier, cfg.env.multi_turn) == kind
