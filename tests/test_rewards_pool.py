"""VerifierPool: parallel scoring with per-call timeouts, error policy, thread and process workers."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from reinforge.rewards.composite import CompositeReward, RewardTerm
from reinforge.rewards.pool import VerifierError, VerifierPool
from reinforge.rewards.verifiers import RewardResult
from reinforge.types import Task


def _task(i: int) -> Task:
    return Task(id=f"t{i}", prompt="p", answer="4")


def _slow_or_broken(task: Task, completion: str) -> RewardResult:
    if completion == "raise":
        raise RuntimeError("verifier bug")
    if completion == "hang":
        time.sleep(1.0)
    if completion == "slow":
        time.sleep(0.1)
    if completion == "die":
        os._exit(3)
    if completion == "not a result":
        return 1.0  # type: ignore[return-value]
    return RewardResult(1.0, True, str(os.getpid()))


def _broken_term(task: Task, completion: str) -> RewardResult:
    raise ValueError("term bug")


@pytest.fixture(scope="module")
def process_pool():
    """One spawned two-worker pool for the module (each worker costs an interpreter start)."""
    with VerifierPool(_slow_or_broken, workers=2, timeout_s=0.5, on_error="zero", kind="process") as pool:
        yield pool


def test_pool_counts_and_logs_errors_and_timeouts(caplog):
    tasks = [_task(i) for i in range(5)]
    with VerifierPool(_slow_or_broken, workers=2, timeout_s=0.3, on_error="zero") as pool:
        with caplog.at_level(logging.WARNING, logger="reinforge.rewards.pool"):
            start = time.monotonic()
            outcomes = pool.score(tasks, ["ok", "raise", "hang", "ok", "not a result"])
            elapsed = time.monotonic() - start
    assert [o.status for o in outcomes] == ["ok", "error", "timeout", "ok", "error"]
    assert [o.reward for o in outcomes] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert "RuntimeError: verifier bug" in outcomes[1].error and "not a RewardResult" in outcomes[4].error
    assert pool.stats == {"calls": 5, "errors": 2, "timeouts": 1}
    assert [(f.task_id, f.status, f.completion) for f in pool.failures][:2] == [
        ("t1", "error", "raise"), ("t2", "timeout", "hang")]
    assert "task 't1'" in caplog.text and "'raise'" in caplog.text and "task 't2'" in caplog.text
    assert elapsed < 0.9, "the timed-out call was waited for"


def test_pool_raise_policy():
    with VerifierPool(_slow_or_broken, workers=2, timeout_s=5) as pool:
        with pytest.raises(VerifierError, match="verifier bug"):
            pool.score([_task(0), _task(1)], ["ok", "raise"])
    with VerifierPool(_slow_or_broken, workers=1, timeout_s=0.2) as pool:
        with pytest.raises(VerifierError, match="timeout on task 't0'"):
            pool.score([_task(0)], ["hang"])


def test_pool_runs_calls_in_parallel_and_times_each_from_its_start():
    active, peak, lock = [0], [0], threading.Lock()

    def slow(task: Task, completion: str) -> RewardResult:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.25)
        with lock:
            active[0] -= 1
        return RewardResult(0.5, False)

    with VerifierPool(slow, workers=2, timeout_s=0.4, on_error="zero") as pool:
        outcomes = pool.score([_task(i) for i in range(6)], ["x"] * 6)
    # six 0.25 s calls on two workers: the last ones start ~0.5 s after submission, past 0.4 s
    assert [o.status for o in outcomes] == ["ok"] * 6 and peak[0] == 2


def test_pool_policy_reaches_a_composite_reward():
    reward = CompositeReward([RewardTerm("ok", "numeric_match"), RewardTerm("bad", _broken_term)])
    with VerifierPool(reward, workers=1, timeout_s=10) as pool:
        with pytest.raises(VerifierError, match="reward term 'bad'"):
            pool.score([_task(0)], ["4"])
        pool.on_error = "zero"  # the composite now zeroes the failed term only
        (outcome,) = pool.score([_task(0)], ["4"])
    assert reward.on_error == "zero"
    assert outcome.status == "ok" and outcome.reward == 1.0 and "bad" in outcome.result.errors


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="kind"):
        VerifierPool(_slow_or_broken, kind="fiber")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pickles"):
        VerifierPool(lambda t, c: RewardResult(0.0, False), kind="process")
    with VerifierPool(_slow_or_broken) as pool, pytest.raises(ValueError, match="on_error"):
        pool.on_error = "ignore"  # type: ignore[assignment]


# --- process workers ----------------------------------------------------------------------------


def test_process_pool_scores_on_two_processes(process_pool):
    process_pool.wait_ready()
    outcomes = process_pool.score([_task(i) for i in range(6)], ["slow"] * 6)
    assert [o.reward for o in outcomes] == [1.0] * 6
    pids = {o.result.answer for o in outcomes}
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_process_pool_kills_a_stuck_call_and_survives_a_dying_worker(process_pool):
    before = {w.process.pid for w in process_pool._backend._workers}
    outcomes = process_pool.score([_task(i) for i in range(5)], ["hang", "raise", "die", "ok", "not a result"])
    assert [o.status for o in outcomes] == ["timeout", "error", "error", "ok", "error"]
    assert "worker killed" in outcomes[0].error and "verifier bug" in outcomes[1].error
    assert "exit code 3" in outcomes[2].error and "not a RewardResult" in outcomes[4].error
    assert 0.5 <= outcomes[0].seconds < 0.95, "the stuck call was not ended at its timeout"
    after = {w.process.pid for w in process_pool._backend._workers}
    assert len(after) == 2 and before != after, "killed workers were not replaced"
    # the replacements work
    assert [o.status for o in process_pool.score([_task(0), _task(1)], ["ok", "ok"])] == ["ok", "ok"]


def test_process_pool_applies_the_raise_policy_and_composite_policy(process_pool):
    process_pool.on_error = "raise"
    try:
        with pytest.raises(VerifierError, match="verifier bug"):
            process_pool.score([_task(0)], ["raise"])
    finally:
        process_pool.on_error = "zero"


def test_thread_pool_reuses_its_threads_and_replaces_one_left_on_a_stuck_call():
    """Calls go to ``workers`` long-lived threads (not a thread each); a call past its timeout leaves its
    thread behind and a fresh one takes the next calls at once, so the pool keeps its width."""
    seen = threading.local()
    threads: list[int] = []

    def counted(task: Task, completion: str) -> RewardResult:
        if not getattr(seen, "counted", False):
            seen.counted = True
            threads.append(1)
        return _slow_or_broken(task, completion)

    tasks = [_task(i) for i in range(40)]
    with VerifierPool(counted, workers=2, timeout_s=0.3, on_error="zero") as pool:
        for _ in range(3):
            assert all(o.status == "ok" for o in pool.score(tasks, ["4"] * 40))
        assert 1 <= len(threads) <= 2
    threads.clear()
    with VerifierPool(counted, workers=1, timeout_s=0.3, on_error="zero") as pool:
        start = time.monotonic()
        outcomes = pool.score(tasks[:4], ["hang", "4", "4", "4"])
        assert [o.status for o in outcomes] == ["timeout", "ok", "ok", "ok"]
        assert time.monotonic() - start < 0.9  # the stuck call's thread still sleeps: another ran the rest
        assert len(threads) == 2
