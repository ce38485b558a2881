"""The verifiers adapter (reinforge/envs/verifiers_env.py): a taskset and a multi-turn Env written here,
played by our collector with tiny-base; rewards equal the rubric's scores computed by hand."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

# a skip without importing verifiers here: collecting the suite should not pay for its import
pytestmark = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="the envs extra is not installed")

from reinforge.data.sources import build_task_splits  # noqa: E402
from reinforge.envs.registry import EnvironmentConfigError, build_environment  # noqa: E402
from reinforge.errors import ConfigError  # noqa: E402
from reinforge.orchestrate.multi_turn import EpisodeLimits, run_episodes  # noqa: E402
from reinforge.rollout.types import SamplingParams  # noqa: E402

SINGLE = textwrap.dedent('''
    import verifiers.v1 as vf

    class AddData(vf.TaskData):
        answer: str

    class AddTask(vf.Task[AddData, vf.State, vf.TaskConfig]):
        @vf.reward(weight=2.0)
        async def has_answer(self, task, trace) -> float:
            return float(task.answer in trace.last_reply)

        @vf.reward(weight=0.5)
        async def brevity(self, trace) -> float:
            return 1.0 / (1 + len(trace.last_reply))

    class AddConfig(vf.TasksetConfig):
        n: int = 6

    class AddTaskset(vf.Taskset[AddTask, AddConfig]):
        def load(self):
            for i in range(self.config.n):
                yield AddTask(AddData(prompt=f"{i}+1=", answer=str(i + 1), system_prompt="add"), self.config.task)

    __all__ = ["AddTaskset"]
''')

MULTI = textwrap.dedent('''
    import verifiers.v1 as vf

    class EchoData(vf.TaskData):
        word: str

    class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def saw_word(self, task, trace) -> float:
            replies = [m.content or "" for m in trace.messages if m.role == "assistant"]
            return sum(task.word in r for r in replies) / len(replies)

        @vf.reward(weight=0.25)
        async def turns(self, trace) -> float:
            return float(trace.num_turns)

    class EchoConfig(vf.TasksetConfig):
        rounds: int = 3

    class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
        def load(self):
            for w in ["a", "b", "c", "d", "e"]:
                yield EchoTask(EchoData(prompt=f"say {w}", word=w), self.config.task)

    class EchoEnvConfig(vf.EnvConfig):
        player: vf.AgentConfig = vf.AgentConfig()
        feedback: str = "again"

    class EchoEnv(vf.Env[EchoEnvConfig]):
        async def run(self, task, agents):
            async with agents.player.interaction(task) as it:
                segment = await it.turn()
                for k in range(self.taskset.config.rounds - 1):
                    segment = await it.turn(f"{self.config.feedback} {k}: {segment.last_reply[:3]}")
            it.trace.record_reward("bonus", 1.0, 0.1)

    __all__ = ["EchoTaskset", "EchoEnv"]
''')


@pytest.fixture
def vf_modules(tmp_path, monkeypatch):
    (tmp_path / "rf_vf_single.py").write_text(SINGLE)
    (tmp_path / "rf_vf_multi.py").write_text(MULTI)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def engine():
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    tok = load_tokenizer("tiny-base")
    return TorchRolloutEngine(load_model("tiny-base", "float32", "cpu"), tok, "cpu", seed=0)


def _splits(params, heldout=2):
    from reinforge.config import EnvConfig

    return build_task_splits(_task_cfg(heldout), EnvConfig.model_validate({"name": "verifiers", **params}))


def _task_cfg(heldout):
    from reinforge.config.task import EnvTaskConfig

    return EnvTaskConfig(heldout_size=heldout)


def _assistant_texts(traj, tok):
    texts, ids = [], traj.token_ids
    for start, end in traj.turn_spans:
        texts.append(tok.decode([i for i, m in zip(ids[start:end], traj.loss_mask[start:end], strict=True) if m],
                                skip_special_tokens=True))
    return texts


def test_single_turn_taskset_rewards_are_the_rubrics_weighted_scores(vf_modules, engine):
    params = {"id": "rf_vf_single", "args": {"n": 6}}
    splits = _splits(params)
    assert len(splits.train) == 4 and len(splits.heldout) == 2
    assert {t.id for t in splits.train}.isdisjoint({t.id for t in splits.heldout})
    task = splits.train[0]
    assert task.prompt[0] == {"role": "system", "content": "add"} and task.prompt[1]["content"].endswith("+1=")
    make = build_environment("verifiers", None, None, params)
    trajs = run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=6, n=2, temperature=1.0),
                         EpisodeLimits(max_turns=3, max_total_tokens=256, max_turn_tokens=6), seed=0)
    assert len(trajs) == 8
    for traj in trajs:
        assert len(traj.turn_rewards) == 1  # SingleAgentEnv: one model turn, then scored
        reply = engine.tokenizer.decode(traj.token_ids[traj.turn_spans[0][0]:traj.turn_spans[0][1]],
                                        skip_special_tokens=True).strip()
        t = next(t for t in splits.train if t.id == traj.task_id)
        has, brevity = float(t.answer in reply), 1.0 / (1 + len(reply))
        assert traj.metadata["reward_terms"] == pytest.approx({"has_answer": has, "brevity": brevity})
        assert traj.reward == pytest.approx(2.0 * has + 0.5 * brevity)
        assert sum(traj.loss_mask) == traj.turn_spans[0][1] - traj.turn_spans[0][0]


def test_multi_turn_env_runs_turn_by_turn_through_our_engine(vf_modules, engine):
    params = {"id": "rf_vf_multi", "args": {"rounds": 3}, "env_args": {"feedback": "more"}}
    splits = _splits(params, heldout=1)
    make = build_environment("verifiers", None, None, params)
    trajs = run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=4, n=2, temperature=1.0),
                         EpisodeLimits(max_turns=5, max_total_tokens=512, max_turn_tokens=4), seed=1)
    assert len(trajs) == 8
    for traj in trajs:
        assert traj.metadata["turns"] == 3 and not traj.metadata["truncated"]
        assert traj.turn_rewards[:2] == [0.0, 0.0]
        # the observations the Env sent, between the turns, quote the model's replies (mask 0)
        obs = traj.metadata["observations"]
        assert [o[0].split(":")[0] for o in obs[:2]] == ["more 0", "more 1"]
        replies = [engine.tokenizer.decode(traj.token_ids[s:e], skip_special_tokens=True).strip()
                   for s, e in traj.turn_spans]
        word = next(t for t in splits.train if t.id == traj.task_id).prompt[-1]["content"].split()[-1]
        saw = sum(word in r for r in replies) / 3
        assert traj.metadata["reward_terms"] == pytest.approx({"saw_word": saw, "turns": 3.0, "bonus": 1.0})
        assert traj.reward == pytest.approx(saw + 0.25 * 3 + 0.1)


def test_an_episode_cut_by_max_turns_ends_without_the_rubric(vf_modules, engine):
    params = {"id": "rf_vf_multi"}
    splits = _splits(params, heldout=1)
    make = build_environment("verifiers", None, None, params)
    trajs = run_episodes(splits.train[:1], engine, make, SamplingParams(max_new_tokens=3, n=1),
                         EpisodeLimits(max_turns=2, max_total_tokens=512, max_turn_tokens=3), seed=0)
    assert trajs[0].metadata["truncated"] == "max_turns" and trajs[0].reward == 0.0


def test_bad_config_names_the_field(vf_modules):
    cases = {
        "env.id": {"id": ""},
        "not found": {"id": "rf_vf_no_such_module"},
        "env.args": {"id": "rf_vf_single", "args": {"n": "many"}},
        "env.env_args": {"id": "rf_vf_single", "env_args": {"feedback": "x"}},
        "env.limit": {"id": "rf_vf_single", "limit": 0},
    }
    for message, params in cases.items():
        with pytest.raises(EnvironmentConfigError, match=message):
            build_environment("verifiers", None, None, params)
    with pytest.raises(ConfigError, match="task.heldout_size"):
        _splits({"id": "rf_vf_single", "args": {"n": 2}}, heldout=2)


def test_a_task_of_another_source_is_refused(vf_modules):
    from reinforge.types import Task

    env = build_environment("verifiers", None, None, {"id": "rf_vf_single"})()
    with pytest.raises(ValueError, match="task.kind=env"):
        env.reset(Task("x", "1+1=", "2"), 0)


def test_a_failing_rubric_is_an_episode_error_under_on_error_zero(vf_modules, engine, tmp_path):
    (tmp_path / "rf_vf_broken.py").write_text(SINGLE.replace("return 1.0 / (1 + len(trace.last_reply))",
                                                             "raise RuntimeError('rubric down')"))
    params = {"id": "rf_vf_broken", "args": {"n": 3}}
    splits = _splits(params, heldout=1)
    make = build_environment("verifiers", None, None, params)
    limits = EpisodeLimits(max_turns=2, max_total_tokens=256, max_turn_tokens=3)
    trajs = run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=3, n=1), limits, seed=0,
                         on_error="zero")
    assert all(t.metadata["truncated"] == "env_error" and "rubric down" in t.metadata["env_error"] for t in trajs)
    from reinforge.errors import ReinforgeError

    with pytest.raises(ReinforgeError, match="rubric down"):
        run_episodes(splits.train, engine, make, SamplingParams(max_new_tokens=3, n=1), limits, seed=0)


@pytest.mark.slow
def test_two_training_steps_on_a_verifiers_environment(vf_modules, tmp_path):
    from reinforge.config import config_from_dict
    from reinforge.orchestrate.run import train
    from reinforge.track.jsonl import read_jsonl

    cfg = config_from_dict({
        "preset": "grpo", "output_dir": str(tmp_path / "run"), "model": {"path": "tiny-base"},
        "task": {"kind": "env", "heldout_size": 2},
        "env": {"name": "verifiers", "id": "rf_vf_multi", "args": {"rounds": 2}, "max_turns": 3,
                "max_turn_tokens": 4},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"steps": 2}, "eval": {"every": 0, "final_samples": 0}, "checkpoint": {"every": 0},
        "log": {"report": False},
    })
    result = train(cfg)
    rows = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["reward/term/turns"] == 2.0 and r["reward/term/bonus"] == 1.0
        assert r["reward/mean"] == pytest.approx(r["reward/term/saw_word"] + 0.25 * 2 + 0.1)


def test_the_shipped_addition_taskset_by_its_dotted_id():
    """reinforge/envs/examples/vf_addition.py, named by its module path (verifiers' own loader cannot import a
    dotted id): seeded distinct problems, and its rubric: exact 1.0 (the reward), ones and abs_error (metrics)."""
    params = {"id": "reinforge.envs.examples.vf_addition", "args": {"n": 30, "seed": 3}}
    splits = _splits(params, heldout=5)
    tasks = [*splits.train, *splits.heldout]
    assert len(tasks) == 30 and len({t.prompt[-1]["content"] for t in tasks}) == 30
    for t in tasks:
        a, b = t.prompt[-1]["content"].removesuffix("=").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99 and t.answer == str(int(a) + int(b))
        assert t.prompt[0]["role"] == "user"  # no system prompt: tiny-base reads digits and + - = only
    assert _splits(params, heldout=5).train == splits.train  # the same seed, the same tasks
    env = build_environment("verifiers", None, None, params)()
    task = splits.train[0]
    answer = task.answer
    env.reset(task, 0)
    right = env.step({"role": "assistant", "content": f" {answer}"})
    assert right.done and right.reward == 1.0 and right.info["correct"]
    assert right.info["reward_terms"] == {"exact": 1.0}
    assert right.info["verifiers_metrics"] == {"ones": 1.0, "abs_error": 0.0}
    env.reset(task, 0)
    near = str(int(answer) + 10)  # the ones digit right, the rest wrong
    wrong = env.step({"role": "assistant", "content": near})
    assert wrong.reward == 0.0 and not wrong.info["correct"]
    assert wrong.info["verifiers_metrics"] == {"ones": 1.0, "abs_error": 10.0}
