"""The ReTool-style code-interpreter environment: python tool calls run in the sandbox, an integer answer
scored against the task; its task source; its registry entry and recipe."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from reinforge.config import load_config
from reinforge.data.agent_tasks import AGENT_TASK_SOURCES
from reinforge.data.code_tasks import CODE_KINDS, KIND_SIZE, code_splits, code_task
from reinforge.envs.code_interpreter import CodeInterpreterEnv
from reinforge.envs.registry import ENVIRONMENTS, EnvironmentConfigError, build_environment, check_task_kind
from reinforge.orchestrate.run import train
from reinforge.track.jsonl import read_jsonl
from reinforge.types import Task

PROGRAMS = {"prod": "print({a}*{b})", "sum": "print(sum(range({a},{b}+1)))", "count": "print({n}//{k})",
            "powmod": "print(pow({a},{e},{m}))"}


def call(code: str, name: str = "python") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"


def say(env: CodeInterpreterEnv, content: str):
    return env.step({"role": "assistant", "content": content})


def perfect_episode(env: CodeInterpreterEnv, task: Task) -> float:
    """A scripted policy: write the task's program, run it, answer with its output."""
    env.reset(task)
    ran = say(env, call(PROGRAMS[task.metadata["kind"]].format(**task.metadata)))
    assert not ran.done and ran.reward == 0.0 and ran.info == {"tool_calls": 1, "tool_errors": 0}
    (message,) = ran.observation
    assert message["role"] == "tool" and message["name"] == "python"
    end = say(env, f"The answer is {message['content']}")
    assert end.done and end.info["correct"] == (end.reward == 1.0)
    return end.reward


@pytest.fixture(scope="module")
def env() -> CodeInterpreterEnv:
    return CodeInterpreterEnv()


def test_the_tasks_have_hand_checked_answers():
    first = {kind: code_task(0, (kind,)) for kind in CODE_KINDS}  # index 0: the first problem of each grid
    assert [(t.prompt[0]["content"], t.answer) for t in first.values()] == [
        ("1000*100=", "100000"), ("sum 1..100=", "5050"), ("multiples of 3 to 100=", "33"),
        ("2^10%97=", "54"),  # 1024 - 10 * 97
    ]
    task = code_task(1, ("prod", "sum"))  # odd index: the second kind, its problem 0
    assert task.id == "code-sum-1" and task.answer == "5050" and task.metadata == {"kind": "sum", "a": 1, "b": 100}


def test_the_splits_are_disjoint_seeded_and_balanced():
    splits = code_splits(heldout_size=50, seed=7)
    assert len(splits.train) + len(splits.heldout) == 4 * KIND_SIZE == 41_040
    held = {t.prompt[0]["content"] for t in splits.heldout}
    assert len(held) == 50 and not held & {splits.train[i].prompt[0]["content"] for i in range(0, len(splits.train), 7)}
    assert [t.id for t in code_splits(heldout_size=50, seed=7).heldout] == [t.id for t in splits.heldout]
    kinds = [t.metadata["kind"] for t in code_splits(kinds="sum,count", heldout_size=400).heldout]
    assert set(kinds) == {"sum", "count"} and 150 < kinds.count("sum") < 250
    expected = {"prod": lambda m: m["a"] * m["b"], "sum": lambda m: sum(range(m["a"], m["b"] + 1)),
                "count": lambda m: len(range(m["k"], m["n"] + 1, m["k"])), "powmod": lambda m: m["a"] ** m["e"] % m["m"]}
    for t in splits.heldout:  # every answer is the exact value of the problem, computed another way
        assert t.answer == str(expected[t.metadata["kind"]](t.metadata))
    assert AGENT_TASK_SOURCES["code_interpreter"] is code_splits
    with pytest.raises(ValueError, match="kinds must be distinct names from prod, sum, count, powmod"):
        code_splits(kinds="sum,sqrt")


def test_a_perfect_policy_solves_every_kind_through_the_sandbox(env):
    tasks = code_splits(heldout_size=12, seed=3).heldout
    assert {t.metadata["kind"] for t in tasks} == set(CODE_KINDS)
    assert [perfect_episode(env, t) for t in tasks] == [1.0] * 12


def test_wrong_or_missing_answers_score_zero(env):
    task = code_task(0, ("sum",))
    env.reset(task)
    assert say(env, "5051").reward == 0.0
    env.reset(task)
    end = say(env, "no idea")
    assert end.done and end.reward == 0.0 and end.info == {"tool_calls": 0, "tool_errors": 0, "correct": False}
    env.reset(task)
    assert say(env, "5050").reward == 1.0  # answering without the tool is allowed: the outcome is scored


def test_bad_code_and_malformed_calls_are_error_results():
    env = CodeInterpreterEnv(max_tool_calls=6)
    env.reset(code_task(0, ("sum",)))
    crash = say(env, call("print(1/0)") + call("print(") + call("x", name="calc") + "<tool_call>{oops</tool_call>")
    contents = [m["content"] for m in crash.observation]
    assert contents[0] == "error: exited with code 1: ZeroDivisionError: division by zero"
    assert contents[1].startswith("error: exited with code 1: SyntaxError")
    assert contents[2] == "error: unknown tool 'calc'; available: python"
    assert contents[3].startswith("error: malformed tool call: invalid JSON")
    assert not crash.done and crash.info == {"tool_calls": 4, "tool_errors": 4}
    assert say(env, "5050").reward == 1.0  # errors cost nothing but tool calls
    env.reset(code_task(0, ("sum",)))
    quiet = say(env, call("x = 5050") + call("print('a' * 1000)"))
    assert quiet.observation[0]["content"] == "(no output)"
    assert quiet.observation[1]["content"] == "a" * 300 + "... [700 more chars]"  # max_output_chars


def test_a_program_that_never_ends_is_killed_at_the_timeout():
    env = CodeInterpreterEnv(timeout_s=0.5)
    env.reset(code_task(0, ("sum",)))
    start = time.monotonic()
    result = say(env, call("while True: pass"))
    assert time.monotonic() - start < 2.5
    assert result.observation[0]["content"].startswith("error: wall-clock timeout") and result.info["tool_errors"] == 1


def test_the_tool_call_limit_ends_the_episode():
    env2 = CodeInterpreterEnv(max_tool_calls=1)
    env2.reset(code_task(0, ("sum",)))
    assert not say(env2, call("print(1)")).done
    end = say(env2, call("print(2)"))
    assert end.done and end.reward == 0.0 and end.info["reason"] == "too many tool calls: 2 > max_tool_calls=1"
    with pytest.raises(RuntimeError, match="reset"):
        say(env2, "5050")


def test_episodes_in_threads_are_independent():
    tasks = code_splits(heldout_size=8, seed=5).heldout
    with ThreadPoolExecutor(8) as pool:
        rewards = list(pool.map(lambda t: perfect_episode(CodeInterpreterEnv(), t), tasks))
    assert rewards == [1.0] * 8


def test_the_registry_entry_checks_its_parameters():
    spec = ENVIRONMENTS["code_interpreter"]
    assert spec.params == {"max_tool_calls": 3, "timeout_s": 3.0, "memory_mb": 256, "max_output_chars": 300}
    env = build_environment("code_interpreter", None, "be brief", {"max_tool_calls": 2})()
    assert env.max_tool_calls == 2 and env.reset(code_task(0, ("sum",)))[0] == {"role": "system", "content": "be brief"}
    with pytest.raises(EnvironmentConfigError, match="timeout_s must be a number >= 0.1"):
        build_environment("code_interpreter", None, None, {"timeout_s": 0})
    with pytest.raises(EnvironmentConfigError, match="has no parameter 'k'"):
        build_environment("code_interpreter", None, None, {"k": 2})
    check_task_kind("code_interpreter", "code_interpreter")
    with pytest.raises(EnvironmentConfigError, match="needs task.kind in"):
        check_task_kind("code_interpreter", "guessing")


@pytest.mark.slow
def test_the_recipe_loads_and_trains_a_step(tmp_path):
    cfg = load_config("agent_code", [f"output_dir={tmp_path}", "train.steps=1", "eval.every=0", "eval.final_samples=0",
                                     "rollout.prompts_per_step=2", "rollout.group_size=2", "task.heldout_size=4",
                                     "train.time_limit_s=0", "log.report=false"])
    assert cfg.task.kind == "code_interpreter" and cfg.env.name == "code_interpreter"
    result = train(cfg)
    (row,) = [m for m in read_jsonl(result.run_dir / "metrics.jsonl") if "reward/mean" in m]
    assert 0.0 <= row["reward/mean"] <= 1.0 and row["episode/turns_mean"] >= 1
