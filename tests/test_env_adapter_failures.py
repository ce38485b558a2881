"""Failure modes of the verifiers and TextArena adapters through the collector (docs/environments.md,
"Environments from other frameworks"): an Env that hangs, a malformed observation, an opponent that hangs or
raises. Each is a clear episode error; under ``on_error: zero`` only that episode ends (every trajectory
comes back, the others play on), under ``raise`` the run stops naming the cause. OpenEnv's (a server not
started, a malformed observation, a server that does not answer) are in tests/test_envs_openenv.py; the
adapters have no tools of their own (unknown tools: tests/test_envs_tools.py, tests/test_mcp_tools.py)."""

from __future__ import annotations

import textwrap

import pytest
from chat_fixtures import ascii_chat_tokenizer, tiny_random_llama

from reinforge.envs.registry import build_environment
from reinforge.errors import ReinforgeError
from reinforge.orchestrate.env_calls import EnvCalls
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes
from reinforge.rollout.torch_engine import TorchRolloutEngine
from reinforge.rollout.types import Generation, SamplingParams

pytest.importorskip("verifiers.v1", reason="the envs extra is not installed")
pytest.importorskip("textarena", reason="the envs extra is not installed")

LIMITS = EpisodeLimits(max_turns=3, max_total_tokens=512, max_turn_tokens=3)

VF_BROKEN = textwrap.dedent('''
    import asyncio
    import verifiers.v1 as vf

    class WData(vf.TaskData):
        mode: str

    class WTask(vf.Task[WData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def answered(self, trace) -> float:
            return 1.0

    class WTaskset(vf.Taskset[WTask, vf.TasksetConfig]):
        def load(self):
            for mode in ["ok", "hang", "malformed", "ok"]:
                yield WTask(WData(prompt=f"go {mode}", mode=mode), self.config.task)

    class WEnvConfig(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()

    class WEnv(vf.Env[WEnvConfig]):
        async def run(self, task, agents):
            async with agents.player.interaction(task) as it:
                await it.turn()
                if task.data.mode == "hang":
                    await asyncio.sleep(3600)       # neither asks for a turn nor ends
                if task.data.mode == "malformed":
                    await it.turn(12345)            # an observation that is neither text nor messages
                await it.turn("once more")

    __all__ = ["WTaskset", "WEnv"]
''')

OPPONENTS = textwrap.dedent('''
    import time

    def hangs(observation, player_id, rng):
        time.sleep(3)
        return "[0]"

    def raises(observation, player_id, rng):
        raise RuntimeError("opponent crashed")
''')


class SaysFour(TorchRolloutEngine):
    """A "model" that always answers "4" (one token and the end of turn)."""

    def generate(self, requests, params, generator=None, on_step=None):
        ids = self.tokenizer("4", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return [Generation(r.request_id, r.prompt_ids, list(ids), [-0.5] * len(ids), "stop", self.version, "4")
                for r in requests for _ in range(params.n)]


@pytest.fixture(scope="module")
def engine():
    tok = ascii_chat_tokenizer()
    return SaysFour(tiny_random_llama(tok), tok, "cpu", seed=0)


@pytest.fixture
def modules(tmp_path, monkeypatch):
    (tmp_path / "rf_vf_broken_env.py").write_text(VF_BROKEN)
    (tmp_path / "rf_ta_bad_opponents.py").write_text(OPPONENTS)
    monkeypatch.syspath_prepend(str(tmp_path))


def _vf_tasks():
    from reinforge.config import EnvConfig
    from reinforge.config.task import EnvTaskConfig
    from reinforge.data.sources import build_task_splits

    splits = build_task_splits(EnvTaskConfig(heldout_size=1), EnvConfig.model_validate(
        {"name": "verifiers", "id": "rf_vf_broken_env"}))
    return sorted([*splits.train, *splits.heldout], key=lambda t: t.metadata["verifiers_index"])


def test_a_verifiers_env_that_hangs_or_sends_a_malformed_observation_ends_only_its_episode(modules, engine):
    tasks = _vf_tasks()
    make = build_environment("verifiers", None, None, {"id": "rf_vf_broken_env", "timeout_s": 0.5})
    trajs = run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=3, n=2), LIMITS, seed=0, on_error="zero")
    assert len(trajs) == 8  # nothing lost: every episode of every task comes back
    by_mode = {t.metadata["verifiers_index"]: [] for t in tasks}
    for traj in trajs:
        by_mode[next(t for t in tasks if t.id == traj.task_id).metadata["verifiers_index"]].append(traj)
    for ok in (by_mode[0], by_mode[3]):  # played to the end and scored
        assert all(t.metadata["truncated"] is None and t.reward == 1.0 and t.metadata["turns"] == 2 for t in ok)
    for t in by_mode[1]:
        assert t.metadata["truncated"] == "env_error" and t.reward == 0.0 and t.trainable
        assert "neither asked for a turn nor ended within 0.5 s" in t.metadata["env_error"]
    for t in by_mode[2]:
        assert t.metadata["truncated"] == "env_error" and t.reward == 0.0
        assert "12345" in t.metadata["env_error"] or "int" in t.metadata["env_error"], t.metadata["env_error"]
    for hung_or_malformed in (tasks[1:2], tasks[2:3]):  # under on_error=raise the run stops, naming the cause
        with pytest.raises(ReinforgeError, match="neither asked for a turn|12345|int"):
            run_episodes(hung_or_malformed, engine, make, SamplingParams(max_new_tokens=3, n=1), LIMITS, seed=0)


def _ta(params):
    from reinforge.envs.textarena_env import textarena_splits

    make = build_environment("textarena", None, None, {"game": "TicTacToe-v0", "move": "[{}]", **params,
                                                       "view": "reinforge.envs.examples.textarena_views:tictactoe"})
    return make, textarena_splits("TicTacToe-v0", 4, 1, 0).train[:2]


def test_a_textarena_opponent_that_hangs_is_an_env_timeout_and_one_that_raises_an_env_error(modules, engine):
    make, tasks = _ta({"opponent": "rf_ta_bad_opponents:hangs"})
    calls = EnvCalls(timeout_s=0.5)
    # reset plays no opponent move (we are Player 0); our first move "[4]" makes the opponent move: it hangs
    trajs = run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=3, n=2), LIMITS, seed=0,
                         env_calls=calls, on_error="zero")
    assert len(trajs) == 4
    assert all(t.metadata["truncated"] == "env_timeout" and t.reward == 0.0 and t.metadata["turns"] == 1 for t in trajs)
    assert calls.stats.timeouts == 4
    make, tasks = _ta({"opponent": "rf_ta_bad_opponents:raises"})
    trajs = run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=3, n=2), LIMITS, seed=0, on_error="zero")
    assert len(trajs) == 4 and all(t.metadata["truncated"] == "env_error" for t in trajs)
    assert all("opponent crashed" in t.metadata["env_error"] for t in trajs)
    with pytest.raises(ReinforgeError, match="opponent crashed"):
        run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=3, n=1), LIMITS, seed=0)


def test_a_textarena_observation_the_view_cannot_read_is_an_env_error(modules, engine):
    from reinforge.envs.examples.textarena_views import tictactoe

    with pytest.raises(ValueError, match="no TicTacToe board"):
        tictactoe("Player 1 says hello", 0)
    # a game whose text the view does not know (our seat's first observation in Connect Four): a reset error,
    # the episode kept untrained under zero
    make = build_environment("textarena", None, None, {"game": "ConnectFour-v0",
                                                       "view": "reinforge.envs.examples.textarena_views:tictactoe"})
    from reinforge.envs.textarena_env import textarena_splits

    tasks = textarena_splits("ConnectFour-v0", 4, 1, 0).train[:1]
    trajs = run_episodes(tasks, engine, make, SamplingParams(max_new_tokens=3, n=2), LIMITS, seed=0, on_error="zero")
    assert len(trajs) == 2
    assert all(t.metadata["truncated"] == "env_error" and not t.trainable for t in trajs)
    assert all("no TicTacToe board" in t.metadata["env_error"] for t in trajs)
