"""The OpenEnv adapter (reinforge/envs/openenv_env.py): a counting environment defined here, served by a
local OpenEnv server (openenv-core's create_app under uvicorn), played by our collector; server failures."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core", reason="the envs extra is not installed")
pytest.importorskip("uvicorn", reason="uvicorn is not installed")

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from reinforge.envs.openenv_env import OpenEnvError, openenv_splits  # noqa: E402
from reinforge.envs.registry import EnvironmentConfigError, build_environment  # noqa: E402
from reinforge.errors import ReinforgeError  # noqa: E402
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes  # noqa: E402
from reinforge.rollout.types import SamplingParams  # noqa: E402


class CountAction(Action):
    message: str


class CountObservation(Observation):
    prompt: str = ""
    expected: int = 0


class CountEnv(Environment):
    """Count on from the reset seed: each step's reward is 1 when the message holds the next number; three
    steps per episode. A message "boom" makes the environment raise (an error answer from the server)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.next, self._state = int(seed or 0) + 1, State(step_count=0)
        return CountObservation(prompt=f"after {self.next - 1}", expected=self.next)

    def step(self, action, timeout_s=None, **kwargs):
        if action.message == "boom":
            raise RuntimeError("the environment broke")
        if action.message == "hang":
            time.sleep(1.5)  # longer than the client's timeout_s in the test
        self._state.step_count += 1
        reward = float(str(self.next) in action.message)
        self.next += 1
        return CountObservation(prompt=f"then {self.next}?", expected=self.next, reward=reward,
                                done=self._state.step_count >= 3)

    @property
    def state(self):
        return self._state


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    app = create_app(CountEnv, CountAction, CountObservation, env_name="count", max_concurrent_envs=8)
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "the OpenEnv test server did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _say(env, text):
    return env.step({"role": "assistant", "content": text})


def test_episode_over_http_sessions_with_rewards_and_done(server):
    splits = openenv_splits(6, 2, 0, server)
    make = build_environment("openenv", None, "count", {"url": server, "observation_field": "prompt"})
    env, task = make(), splits.train[0]
    seed = task.metadata["reset_seed"]
    first = env.reset(task, 0)
    assert first == [{"role": "system", "content": "count"}, {"role": "user", "content": f"after {seed}"}]
    r1, r2, r3 = _say(env, str(seed + 1)), _say(env, "no"), _say(env, f"it is {seed + 3}")
    assert (r1.reward, r2.reward, r3.reward) == (1.0, 0.0, 1.0) and [r.done for r in (r1, r2, r3)] == [False, False, True]
    assert r1.observation == [{"role": "user", "content": f"then {seed + 2}?"}] and r3.info["openenv_steps"] == 3
    # two episodes at once keep their own server sessions
    a, b = make(), make()
    a.reset(splits.train[1], 0)
    b.reset(splits.train[2], 0)
    assert _say(a, str(splits.train[1].metadata["reset_seed"] + 1)).reward == 1.0
    assert _say(b, str(splits.train[2].metadata["reset_seed"] + 1)).reward == 1.0
    # every field when no observation_field is named
    env = build_environment("openenv", None, None, {"url": server})()
    assert env.reset(task, 0)[-1]["content"] == f"prompt: after {seed}\nexpected: {seed + 1}"


@pytest.mark.slow
def test_collector_plays_episodes_and_rewards_sum_per_turn(server):
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    tok = load_tokenizer("tiny-base")
    engine = TorchRolloutEngine(load_model("tiny-base", "float32", "cpu"), tok, "cpu", seed=0)
    splits = openenv_splits(6, 2, 0, server)
    make = build_environment("openenv", None, None, {"url": server, "observation_field": "prompt"})
    trajs = run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=3, n=2, temperature=1.0),
                         EpisodeLimits(max_turns=4, max_total_tokens=64, max_turn_tokens=3), seed=0)
    assert len(trajs) == 8
    for t in trajs:
        task = next(x for x in splits.train if x.id == t.task_id)
        texts = [tok.decode(t.token_ids[s:e], skip_special_tokens=True) for s, e in t.turn_spans]
        expected = [float(str(task.metadata["reset_seed"] + 1 + k) in text) for k, text in enumerate(texts)]
        assert t.turn_rewards == expected and t.reward == sum(expected)
        assert t.metadata["truncated"] in (None, "max_total_tokens")
        assert (t.metadata["turns"] == 3) == (t.metadata["truncated"] is None)


def test_server_failures_are_episode_errors(server):
    task = openenv_splits(4, 1, 0, server).train[0]
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    env = build_environment("openenv", None, None, {"url": dead, "timeout_s": 2})()
    with pytest.raises(OpenEnvError, match="reset failed"):
        env.reset(task, 0)
    env = build_environment("openenv", None, None, {"url": server, "observation_field": "nope"})()
    with pytest.raises(OpenEnvError, match="malformed observation, no field env.observation_field='nope'"):
        env.reset(task, 0)
    env = build_environment("openenv", None, None, {"url": server})()
    env.reset(task, 0)
    with pytest.raises(OpenEnvError, match="step failed"):
        _say(env, "boom")
    env = build_environment("openenv", None, None, {"url": server, "timeout_s": 0.3})()  # a step that hangs
    env.reset(task, 0)
    with pytest.raises(OpenEnvError, match=r"step failed \(no answer within 0.3 s\)"):
        _say(env, "hang")


def test_a_dead_server_ends_episodes_under_on_error_zero_and_stops_the_run_under_raise(server):
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    tok = load_tokenizer("tiny-base")
    engine = TorchRolloutEngine(load_model("tiny-base", "float32", "cpu"), tok, "cpu", seed=0)
    tasks = openenv_splits(4, 1, 0, server).train[:2]
    dead = build_environment("openenv", None, None, {"url": f"http://127.0.0.1:{_free_port()}", "timeout_s": 2})
    limits = EpisodeLimits(max_turns=2, max_total_tokens=64, max_turn_tokens=3)
    trajs = run_episodes(tasks, engine, dead, SamplingParams(max_new_tokens=3, n=2), limits, seed=0, on_error="zero")
    assert len(trajs) == 4
    for t in trajs:
        assert t.metadata["truncated"] == "env_error" and "reset failed" in t.metadata["env_error"]
        assert t.reward == 0.0 and not t.trainable and sum(t.loss_mask) == 0
    with pytest.raises(ReinforgeError, match="reset on task"):
        run_episodes(tasks, engine, dead, SamplingParams(max_new_tokens=3, n=1), limits, seed=0)
    # the server's error mid-episode: the episode ends, the others go on
    class Booms:
        def __init__(self):
            self.env, self.calls = build_environment("openenv", None, None, {"url": server})(), 0

        def reset(self, task, seed):
            return self.env.reset(task, seed)

        def step(self, assistant):
            return self.env.step({"role": "assistant", "content": "boom"})

    trajs = run_episodes(tasks, engine, Booms, SamplingParams(max_new_tokens=3, n=1), limits, seed=0, on_error="zero")
    assert all(t.metadata["truncated"] == "env_error" and "step failed" in t.metadata["env_error"] for t in trajs)
    assert all(t.trainable for t in trajs)


def test_bad_config_names_the_field(server):
    cases = {"env.url": {"url": "localhost:1"}, "env.action_field": {"url": server, "action_field": ""},
             "env.reset_args": {"url": server, "reset_args": [1]},
             "env.action_args": {"url": server, "action_args": {"message": "x"}},
             "env.timeout_s": {"url": server, "timeout_s": 0}}
    for message, params in cases.items():
        with pytest.raises(EnvironmentConfigError, match=message):
            build_environment("openenv", None, None, params)
    with pytest.raises(ValueError, match="env.episodes"):
        openenv_splits(1, 1, 0, server)


@pytest.mark.slow
def test_training_goes_on_when_the_server_is_dead_under_on_error_zero(tmp_path):
    """Every reset fails (nothing listens at the URL): each step's episodes end as environment errors,
    untrained, and the run finishes its steps."""
    from reinforge.config import config_from_dict
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = config_from_dict({
        "preset": "grpo", "output_dir": str(tmp_path), "model": {"path": "tiny-base"},
        "task": {"kind": "env", "heldout_size": 2},
        "env": {"name": "openenv", "url": f"http://127.0.0.1:{_free_port()}", "episodes": 6, "timeout_s": 2,
                "max_turns": 2, "max_turn_tokens": 3},
        "reward": {"on_error": "zero"},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
        "train": {"steps": 2}, "eval": {"every": 0, "final_samples": 0}, "checkpoint": {"every": 0},
        "log": {"report": False},
    })
    rows = [m for m in read_jsonl(train(cfg).run_dir / "metrics.jsonl") if "env/errors" in m]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["env/errors"] == 4 and r["reward/mean"] == 0.0 for r in rows)
