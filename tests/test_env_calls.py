"""Environment calls at real latency: concurrent, bounded, timed out per call, async environments, the
latency wrapper, and trajectories that do not depend on whether the calls overlapped."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

from reinforge.config import load_config
from reinforge.envs.latency import DelayedEnv, LatencySettings, with_latency
from reinforge.envs.registry import build_environment
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.env_calls import EnvCalls
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import SamplingParams
from reinforge.types import Task


def _sleeper(seconds: float, log: list, name: str):
    def call():
        log.append((name, "start", time.perf_counter()))
        time.sleep(seconds)
        log.append((name, "end", time.perf_counter()))
        return name

    return call


def test_the_concurrency_limit_holds_and_a_finished_call_frees_its_slot():
    log: list = []
    calls = EnvCalls(concurrency=2, timeout_s=5)
    t0 = time.perf_counter()
    out = calls.run([_sleeper(s, log, n) for n, s in [("a", 0.05), ("b", 0.4), ("c", 0.05), ("d", 0.05)]])
    elapsed = time.perf_counter() - t0
    assert [o.value for o in out] == ["a", "b", "c", "d"] and calls.stats.in_flight_max == 2
    events = {(n, kind): t for n, kind, t in log}
    # c starts when a ends and d when c ends, while b still runs: a lockstep pair (a, b) then (c, d) would take 0.45 s
    assert events["c", "start"] >= events["a", "end"] and events["d", "start"] >= events["c", "end"]
    assert events["d", "end"] < events["b", "end"] and elapsed < 0.44
    assert calls.stats.calls == 4 and calls.stats.call_s == pytest.approx(0.55, abs=0.1)


def test_calls_overlap_up_to_the_limit():
    calls = EnvCalls(concurrency=8, timeout_s=5)
    t0 = time.perf_counter()
    calls.run([_sleeper(0.2, [], str(i)) for i in range(16)])
    assert time.perf_counter() - t0 < 0.2 * 16 / 4  # two waves of 8, not 16 calls in a row
    assert calls.stats.in_flight_max == 8


def test_a_hung_call_times_out_alone_and_errors_are_returned():
    calls = EnvCalls(concurrency=4, timeout_s=0.3)
    release = threading.Event()

    def hangs():
        release.wait(10)

    def raises():
        raise ValueError("tool broke")

    t0 = time.perf_counter()
    out = calls.run([hangs, raises, lambda: 7])
    release.set()
    assert time.perf_counter() - t0 < 2.0
    assert out[0].timed_out and isinstance(out[1].error, ValueError) and out[2].value == 7
    assert (calls.stats.timeouts, calls.stats.errors) == (1, 1)
    assert calls.take_stats().calls == 3 and calls.stats.calls == 0


def test_a_timeout_the_environment_raises_itself_is_its_error_not_a_timed_out_call():
    """An environment whose own client gives up (TimeoutError) well within the call's limit: an error with
    its message (reward.on_error decides), not "timed out after <limit>"."""
    calls = EnvCalls(timeout_s=5)

    def gives_up():
        raise TimeoutError("the server did not answer within 0.1 s")

    async def gives_up_async():
        raise TimeoutError("no reply")

    out = calls.run([gives_up, gives_up_async])
    assert [o.timed_out for o in out] == [False, False]
    assert [str(o.error) for o in out] == ["the server did not answer within 0.1 s", "no reply"]
    assert (calls.stats.timeouts, calls.stats.errors) == (0, 2)


def test_async_calls_run_on_the_event_loop_and_are_cancelled_at_their_timeout():
    calls = EnvCalls(concurrency=16, timeout_s=1.5)
    cancelled = []

    async def waits(seconds: float) -> float:
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(seconds)
            raise
        return seconds

    async def fast() -> float:
        return await waits(0.2)

    async def slow() -> float:
        return await waits(30.0)

    t0 = time.perf_counter()
    out = calls.run([fast] * 15 + [slow])
    # concurrent: 15 x 0.2 s one after another would be 3 s; the slow call is cancelled at its 1.5 s timeout
    # (the slack above 0.2 s keeps the fast calls in time on a loaded machine)
    assert time.perf_counter() - t0 < 2.8 and [o.value for o in out[:15]] == [0.2] * 15
    assert out[15].timed_out and cancelled == [30.0]


def test_lognormal_delays_have_the_mean_and_repeat_per_seed():
    env = DelayedEnv(object(), LatencySettings(dist="lognormal", mean_s=0.2, sigma=0.5))
    env.rng.seed(3)
    draws = [env.delay() for _ in range(20000)]
    assert sum(draws) / len(draws) == pytest.approx(0.2, rel=0.02)
    env.rng.seed(3)
    assert [env.delay() for _ in range(5)] == draws[:5]
    assert DelayedEnv(object(), LatencySettings(mean_s=0.05)).delay() == 0.05


# ---- episodes -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    tok = ascii_chat_tokenizer()
    return TorchRolloutEngine(tiny_random_llama(tok), tok, "cpu", seed=0)


def _calculator(latency: dict | None):
    make_env = build_environment("calculator", None, None, {"max_tool_calls": 3})
    return with_latency(make_env, latency) if latency else make_env


def _episodes(engine, make_env, calls: EnvCalls, on_error="raise"):
    engine.generator.manual_seed(0)
    tasks = [Task(f"t{i}", f"{100 + i}*{20 + i}=", str((100 + i) * (20 + i))) for i in range(4)]
    params = SamplingParams(max_new_tokens=8, n=4, temperature=1.0)
    return run_episodes(tasks, engine, make_env, params, EpisodeLimits(max_turns=3, max_turn_tokens=8), seed=1,
                        env_calls=calls, on_error=on_error)


def _same(a, b) -> bool:
    return all(x.token_ids == y.token_ids and x.loss_mask == y.loss_mask and x.logprobs == y.logprobs
               and x.turn_rewards == y.turn_rewards for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_concurrent_and_one_at_a_time_episodes_are_identical_and_concurrency_pays(engine, asynchronous):
    latency = {"dist": "lognormal", "mean_s": 0.05, "sigma": 0.5, "asynchronous": asynchronous}
    sequential, concurrent = EnvCalls(concurrency=1), EnvCalls(concurrency=16)
    one = _episodes(engine, _calculator(latency), sequential)
    many = _episodes(engine, _calculator(latency), concurrent)
    assert _same(one, many) and _same(one, _episodes(engine, _calculator(None), EnvCalls()))
    assert sequential.stats.in_flight_max == 1 and concurrent.stats.in_flight_max == 16
    # the waiting on environments (not the generation, which a loaded machine slows) shrinks
    assert sequential.stats.calls == concurrent.stats.calls and sequential.stats.wait_s > 3 * concurrent.stats.wait_s


class _HangsOn:
    """The calculator environment, except that a step of task ``t1`` hangs (or raises)."""

    def __init__(self, inner, how: str) -> None:
        self.inner, self.how, self.task = inner, how, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def reset(self, task, seed):
        self.task = task
        return self.inner.reset(task, seed)

    def step(self, assistant):
        if self.task.id == "t1":
            if self.how == "hang":
                time.sleep(3.0)
            raise RuntimeError("the tool server is down")
        return self.inner.step(assistant)


def test_a_hung_environment_times_out_its_episodes_only(engine):
    make = build_environment("calculator", None, None, {})
    t0 = time.perf_counter()
    trajs = _episodes(engine, lambda: _HangsOn(make(), "hang"), EnvCalls(concurrency=16, timeout_s=0.3))
    assert time.perf_counter() - t0 < 2.5
    for t in trajs:
        if t.task_id == "t1":
            assert t.metadata["truncated"] == "env_timeout" and t.finish_reason == "length" and t.reward == 0.0
            assert t.metadata["env_error"] == "step timed out after 0.3 s" and t.metadata["turns"] == 1
        else:
            assert t.metadata["truncated"] != "env_timeout"


def test_a_raising_environment_stops_the_run_or_ends_its_episode_under_zero(engine):
    make = build_environment("calculator", None, None, {})
    with pytest.raises(ReinforgeError, match="raised RuntimeError: the tool server is down on task 't1'"):
        _episodes(engine, lambda: _HangsOn(make(), "raise"), EnvCalls())
    trajs = _episodes(engine, lambda: _HangsOn(make(), "raise"), EnvCalls(), on_error=lambda: "zero")
    broken = [t for t in trajs if t.task_id == "t1"]
    assert len(broken) == 4 and all(t.metadata["truncated"] == "env_error" and t.reward == 0.0 for t in broken)
    assert all("the tool server is down" in t.metadata["env_error"] for t in broken)


def test_a_reset_that_fails_names_the_environment_and_task(engine):
    class BadReset:
        def reset(self, task, seed):
            raise KeyError("no such task")

    with pytest.raises(ReinforgeError, match="environment BadReset: reset on task 't0'"):
        _episodes(engine, BadReset, EnvCalls())


@pytest.mark.slow
def test_recipe_options_and_step_metrics(tmp_path):
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    with pytest.raises(Exception, match="env.latency.dist"):
        load_config("agent_calculator", ["env.latency={dist: gamma, mean_s: 0.1}"])
    with pytest.raises(Exception, match="env.concurrency"):
        load_config("agent_calculator", ["env.concurrency=0"])
    result = train(load_config("agent_calculator", [
        f"output_dir={tmp_path}", "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "task.heldout_size=4", "eval.every=0", "eval.final_samples=0", "checkpoint.every=0", "log.report=false",
        "env.latency={dist: fixed, mean_s: 0.02}", "env.concurrency=4"]))
    (row,) = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if m["step"] == 1]
    assert row["env/calls"] >= 8 and row["perf/env_in_flight_max"] == 4 and row["env/timeouts"] == 0
    steps = row["env/calls"] - 8  # the calls are 8 resets (2 prompts x 4), then the delayed steps
    assert row["time/env_call_s"] >= 0.02 * steps and row["time/env_s"] >= 0.02 * steps / 4
