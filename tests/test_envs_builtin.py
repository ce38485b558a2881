"""Built-in agent environments (calculator, guessing, retry), their task sources and the registry,
driven by scripted assistant messages."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from reinforge.data.agent_tasks import (
    AGENT_TASK_SOURCES,
    calculator_splits,
    calculator_task,
    guessing_splits,
    guessing_task,
)
from reinforge.envs.calculator import MAX_EXPR_CHARS, CalculatorEnv, evaluate, last_integer
from reinforge.envs.guessing import GuessingEnv
from reinforge.envs.registry import ENVIRONMENTS, build_environment, check_task_kind
from reinforge.envs.retry import RetryEnv
from reinforge.envs.single_turn import SingleTurnEnv
from reinforge.envs.tools import ToolError
from reinforge.errors import ConfigError
from reinforge.rewards.verifiers import numeric_match
from reinforge.types import Task


def say(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def calc_call(expr: str) -> str:
    return f'<tool_call>{{"name": "calc", "arguments": {{"expr": "{expr}"}}}}</tool_call>'


CALC_TASK = Task(id="calc-x", prompt=[{"role": "user", "content": "482*37="}], answer="17834", metadata={"a": 482, "b": 37})
GUESS_TASK = Task(id="guess-20", prompt=[{"role": "user", "content": "guess 1-32"}], answer="20", metadata={"low": 1, "high": 32})


# ---------------------------------------------------------------- calc


@pytest.mark.parametrize(
    "expr, value",
    [("482*37", 17834), (" 2 + 3*4 ", 14), ("-(3+4)*2", -14), ("2 - -3", 5), ("+7", 7), ("(1+2)*(3-5)", -6)],
)
def test_calc_evaluates_integer_arithmetic(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize(
    "expr, message",
    [
        ("__import__('os')", "only integers, + - * and parentheses are allowed, not \"__import__('os')\""),
        ("2**99999", "only integers, + - * and parentheses are allowed, not '2 ** 99999'"),
        ("7/2", "only integers, + - * and parentheses are allowed, not '7 / 2'"),
        ("1.5*2", "only integers, + - * and parentheses are allowed, not '1.5'"),
        ("True+1", "only integers, + - * and parentheses are allowed, not 'True'"),
        ("x*2", "only integers, + - * and parentheses are allowed, not 'x'"),
        ("9" * 31, "number too large (over 30 digits)"),
        ("99999999999999999*99999999999999", "number too large (over 30 digits)"),  # 17 x 14 digits: 31
        ("1" * (MAX_EXPR_CHARS + 1), f"expression too long ({MAX_EXPR_CHARS + 1} > {MAX_EXPR_CHARS} chars)"),
        ("(1+", "not an expression: '(1+'"),
        ("", "not an expression: ''"),
    ],
)
def test_calc_rejects_everything_else(expr, message):
    with pytest.raises(ToolError) as e:
        evaluate(expr)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "text, value",
    [("17834", 17834), ("482*37=17834", 17834), ("5-3", 3), ("=-7", -7), ("-12 then 40.", 40), ("none", None), ("", None)],
)
def test_last_integer(text, value):
    assert last_integer(text) == value


# ---------------------------------------------------------------- CalculatorEnv


def test_calculator_correct_path_with_a_tool_call():
    env = CalculatorEnv()
    assert env.reset(CALC_TASK, seed=0) == [{"role": "user", "content": "482*37="}]
    assert env.tools.schemas[0]["function"]["name"] == "calc"
    step = env.step(say(calc_call("482*37")))
    assert step.observation == [{"role": "tool", "content": "17834", "name": "calc"}]
    assert (step.reward, step.done, step.info) == (0.0, False, {"tool_calls": 1, "tool_errors": 0})
    final = env.step(say("the answer is 17834"))
    assert (final.observation, final.reward, final.done) == ([], 1.0, True)
    assert final.info == {"tool_calls": 1, "tool_errors": 0, "correct": True}
    with pytest.raises(RuntimeError, match="reset"):
        env.step(say("17834"))


def test_calculator_wrong_answer_without_tools():
    env = CalculatorEnv(system_prompt="use calc")
    assert env.reset(CALC_TASK, seed=0)[0] == {"role": "system", "content": "use calc"}
    final = env.step(say("17000"))
    assert (final.reward, final.done, final.info) == (0.0, True, {"tool_calls": 0, "tool_errors": 0, "correct": False})


def test_calculator_malformed_and_bad_calls_are_observations():
    env = CalculatorEnv(max_tool_calls=5)
    env.reset(CALC_TASK, seed=0)
    text = (
        '<tool_call>{"name": "calc", "arguments": {"expr": "482*37"</tool_call>'
        '<tool_call>{"name": "sqrt", "arguments": {"x": 4}}</tool_call>'
        + calc_call("2**99999")
    )
    step = env.step(say(text))
    assert [m["content"] for m in step.observation] == [
        "error: malformed tool call: invalid JSON: Expecting ',' delimiter: line 1 column 48 (char 47)",
        "error: unknown tool 'sqrt'; available: calc",
        "error: only integers, + - * and parentheses are allowed, not '2 ** 99999'",
    ]
    assert [m.get("name") for m in step.observation] == [None, "sqrt", "calc"]
    assert (step.reward, step.done, step.info) == (0.0, False, {"tool_calls": 3, "tool_errors": 3})
    unclosed = env.step(say('<tool_call>{"name": "calc"'))
    assert unclosed.observation[0]["content"] == "error: malformed tool call: unclosed <tool_call>: no </tool_call> after it"
    assert unclosed.info == {"tool_calls": 4, "tool_errors": 4}
    final = env.step(say("17834"))
    assert final.info == {"tool_calls": 4, "tool_errors": 4, "correct": True} and final.reward == 1.0


def test_calculator_tool_call_limit_ends_the_episode():
    env = CalculatorEnv(max_tool_calls=2)
    env.reset(CALC_TASK, seed=0)
    assert not env.step(say(calc_call("1+1"))).done
    over = env.step(say(calc_call("2+2") + calc_call("3+3")))
    assert (over.observation, over.reward, over.done) == ([], 0.0, True)
    assert over.info == {
        "tool_calls": 3, "tool_errors": 0, "correct": False, "reason": "too many tool calls: 3 > max_tool_calls=2",
    }


def test_calculator_rejects_bad_setup():
    with pytest.raises(ValueError, match="max_tool_calls"):
        CalculatorEnv(max_tool_calls=-1)
    with pytest.raises(ValueError, match="integer answer"):
        CalculatorEnv().reset(Task(id="t", prompt="q", answer="abc"), seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        CalculatorEnv().step(say("1"))


# ---------------------------------------------------------------- GuessingEnv


def test_guessing_full_episode():
    env = GuessingEnv()
    assert env.reset(GUESS_TASK, seed=3) == [{"role": "user", "content": "guess 1-32"}]
    script = [("16", "higher"), ("24", "lower"), ("hmm", "say a number"), ("from 1-32 I say 19", "higher")]
    for n, (text, hint) in enumerate(script, start=1):
        step = env.step(say(text))
        assert (step.observation, step.reward, step.done, step.info) == (
            [{"role": "user", "content": hint}], 0.0, False, {"guesses": n},
        )
    final = env.step(say("20"))
    assert (final.observation, final.reward, final.done, final.info) == ([], 1.0, True, {"correct": True, "guesses": 5})


def test_guessing_runs_out_of_guesses():
    env = GuessingEnv(max_guesses=2)
    env.reset(GUESS_TASK, seed=0)
    assert env.step(say("1")).observation == [{"role": "user", "content": "higher"}]
    final = env.step(say("no idea"))
    assert (final.reward, final.done, final.info) == (0.0, True, {"correct": False, "guesses": 2})
    with pytest.raises(ValueError, match="max_guesses"):
        GuessingEnv(max_guesses=0)


# ---------------------------------------------------------------- RetryEnv


ARITH_TASK = Task(id="a", prompt=[{"role": "user", "content": "12+30="}], answer="42")


def test_retry_succeeds_on_the_third_attempt_with_decay():
    env = RetryEnv(SingleTurnEnv(numeric_match), max_attempts=3, decay=0.5)
    assert env.reset(ARITH_TASK, seed=0) == [{"role": "user", "content": "12+30="}]
    for n in (1, 2):
        step = env.step(say("41"))
        assert (step.observation, step.reward, step.done, step.info) == (
            [{"role": "user", "content": "wrong, try again"}], 0.0, False, {"attempts": n},
        )
    final = env.step(say("42"))
    assert (final.observation, final.reward, final.done, final.info) == ([], 0.25, True, {"correct": True, "attempts": 3})


def test_retry_gives_up_after_max_attempts():
    env = RetryEnv(SingleTurnEnv(numeric_match), max_attempts=2, feedback="no")
    env.reset(ARITH_TASK, seed=0)
    assert env.step(say("1")).observation == [{"role": "user", "content": "no"}]
    final = env.step(say("2"))
    assert (final.reward, final.done, final.info) == (0.0, True, {"correct": False, "attempts": 2})


class PartialCredit:
    """A single-turn env that always gives 0.5 and says wrong."""

    def reset(self, task, seed=0):
        return [{"role": "user", "content": "q"}]

    def step(self, assistant):
        from reinforge.envs.base import StepResult

        return StepResult([], 0.5, True, {"correct": False, "reward_terms": {"format": 0.5}})


def test_retry_keeps_the_last_partial_reward_scaled():
    env = RetryEnv(PartialCredit(), max_attempts=3, decay=0.5)
    env.reset(ARITH_TASK, seed=0)
    env.step(say("a"))
    env.step(say("b"))
    final = env.step(say("c"))
    assert final.reward == 0.125  # 0.5 * 0.5**2
    assert final.info == {"correct": False, "attempts": 3, "reward_terms": {"format": 0.5}}


def test_retry_refuses_multi_turn_inner_and_bad_params():
    env = RetryEnv(GuessingEnv())
    env.reset(GUESS_TASK, seed=0)
    with pytest.raises(ValueError, match="single-turn"):
        env.step(say("1"))
    with pytest.raises(ValueError, match="decay"):
        RetryEnv(SingleTurnEnv(numeric_match), decay=1.5)
    with pytest.raises(ValueError, match="max_attempts"):
        RetryEnv(SingleTurnEnv(numeric_match), max_attempts=0)


# ---------------------------------------------------------------- determinism


def _play(env_factory, task, script):
    env = env_factory()
    out = [env.reset(task, seed=7)]
    for text in script:
        step = env.step(say(text))
        out.append((step.observation, step.reward, step.done, step.info))
        if step.done:
            break
    return out


@pytest.mark.parametrize(
    "factory, task, script",
    [
        (CalculatorEnv, CALC_TASK, [calc_call("482*37"), "<tool_call>{", "17834"]),
        (GuessingEnv, GUESS_TASK, ["16", "24", "x", "20"]),
        (lambda: RetryEnv(SingleTurnEnv(numeric_match)), ARITH_TASK, ["1", "42"]),
    ],
)
def test_episodes_are_deterministic(factory, task, script):
    assert _play(factory, task, script) == _play(factory, task, script)


# ---------------------------------------------------------------- task sources


def test_calculator_splits_are_disjoint_and_deterministic():
    splits = calculator_splits(digits=(3, 2), ops="*", heldout_size=200, seed=1)
    assert (len(splits.train), len(splits.heldout)) == (80800, 200)  # 900 * 90 problems
    train_ids = {t.id for t in splits.train[:]}
    heldout_ids = {t.id for t in splits.heldout[:]}
    assert not train_ids & heldout_ids and len(train_ids | heldout_ids) == 81000
    again = calculator_splits(digits=(3, 2), ops="*", heldout_size=200, seed=1)
    assert [t.id for t in again.heldout[:]] == [t.id for t in splits.heldout[:]]
    other = calculator_splits(digits=(3, 2), ops="*", heldout_size=200, seed=2)
    assert [t.id for t in other.heldout[:]] != [t.id for t in splits.heldout[:]]
    assert pickle.loads(pickle.dumps(splits)).heldout[0] == splits.heldout[0]


def test_calculator_task_content():
    assert calculator_task(0, (3, 2), "*") == Task(
        id="calc-0", prompt=[{"role": "user", "content": "100*10="}], answer="1000", metadata={"a": 100, "b": 10, "op": "*"}
    )
    task = calculator_task(12345, (3, 2), "*")  # divmod(12345, 90) = (137, 15)
    assert (task.prompt[0]["content"], task.answer) == ("237*25=", "5925")
    plus = calculator_task(81000 + 7, (3, 2), "+*")  # second operator, a=100, b=17
    assert (plus.prompt[0]["content"], plus.answer) == ("100*17=", "1700")
    assert calculator_task(0, (3, 2), "+-").answer == "110"


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"digits": (5, 1)}, "digits"), ({"ops": "/"}, "ops"), ({"ops": "**"}, "distinct"), ({"heldout_size": 0}, "heldout_size")],
)
def test_calculator_splits_errors(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        calculator_splits(**kwargs)


def test_guessing_splits_are_disjoint_by_secret():
    splits = guessing_splits(low=1, high=32, heldout_size=8, seed=0)
    train = {int(t.answer) for t in splits.train[:]}
    heldout = {int(t.answer) for t in splits.heldout[:]}
    assert len(heldout) == 8 and len(train) == 24 and not train & heldout and train | heldout == set(range(1, 33))
    task = splits.heldout[0]
    assert task.id == f"guess-{task.answer}"
    assert task.prompt == [{"role": "user", "content": "guess 1-32"}] and task.metadata == {"low": 1, "high": 32}
    assert [t.id for t in guessing_splits(1, 32, 8, seed=0).heldout[:]] == [t.id for t in splits.heldout[:]]
    with pytest.raises(ValueError, match="low < high"):
        guessing_splits(low=5, high=5)
    assert set(AGENT_TASK_SOURCES) == {"calculator", "guessing", "code_interpreter", "search", "nim"}


def test_guessing_splits_with_repeats_hold_every_secret_in_both_splits():
    splits = guessing_splits(low=1, high=32, heldout_size=320, seed=0, repeats=50)
    train, heldout = splits.train[:], splits.heldout[:]
    assert len(train) == 32 * 50 - 320 and len(heldout) == 320
    assert not {t.id for t in train} & {t.id for t in heldout}
    assert {int(t.answer) for t in train} == {int(t.answer) for t in heldout} == set(range(1, 33))
    counts = np.bincount([int(t.answer) for t in heldout], minlength=33)[1:]
    assert counts.min() >= 3 and counts.max() <= 20  # about 10 per secret: uniform, not a block of secrets
    assert [t.id for t in guessing_splits(1, 32, 8, seed=0, repeats=2).train[:]][:3] == ["guess-1", "guess-2", "guess-3"]
    assert guessing_task(32 + 6, low=1, high=32).id == "guess-7-r1"
    assert guessing_task(32 + 6, low=1, high=32).answer == "7"
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        guessing_splits(repeats=0)


# ---------------------------------------------------------------- registry


def test_registry_builds_fresh_environments():
    assert set(ENVIRONMENTS) == {"single_turn", "calculator", "guessing", "code_interpreter", "search", "retry", "nim",
                                 "agent", "verifiers", "openenv", "textarena", "guess_duel", "tictactoe",
                                 "problem_synthesis", "simulated_user"}
    agent = build_environment("agent", None, None)  # the loop runs agents through the proxy: never an Environment
    with pytest.raises(ConfigError, match="through the OpenAI-compatible proxy"):
        agent()
    assert ENVIRONMENTS["retry"].params == {"max_attempts": 3, "feedback": "wrong, try again", "decay": 1.0}
    factory = build_environment("guessing", None, None, {"max_guesses": 2})
    a, b = factory(), factory()
    assert isinstance(a, GuessingEnv) and a is not b and a.max_guesses == 2
    calc = build_environment("calculator", None, "sys", {})()
    assert isinstance(calc, CalculatorEnv) and calc.reset(CALC_TASK, 0)[0] == {"role": "system", "content": "sys"}
    assert isinstance(build_environment("single_turn", numeric_match, None, None)(), SingleTurnEnv)


def test_registry_retry_wraps_the_verifier():
    factory = build_environment("retry", numeric_match, None, {"max_attempts": 2, "decay": 0.5})
    env = pickle.loads(pickle.dumps(factory))()  # picklable, for process / Ray workers
    env.reset(ARITH_TASK, seed=0)
    assert not env.step(say("0")).done
    assert env.step(say("42")).reward == 0.5


@pytest.mark.parametrize(
    "name, verifier, params, message",
    [
        ("chess", None, {}, "unknown environment 'chess'; allowed: single_turn, calculator, guessing, retry"),
        ("guessing", None, {"max_guess": 3}, "'guessing' has no parameter 'max_guess'; allowed: max_guesses (default 6)"),
        ("single_turn", numeric_match, {"x": 1}, "'single_turn' has no parameter 'x'; allowed: none"),
        ("guessing", None, {"max_guesses": 0}, "max_guesses must be an integer >= 1, got 0"),
        ("retry", numeric_match, {"decay": "high"}, "decay must be a number in [0, 1], got 'high'"),
        ("retry", None, {}, "env 'retry' scores with the task's verifier, but none was given"),
    ],
)
def test_registry_errors_name_the_allowed_values(name, verifier, params, message):
    with pytest.raises(ValueError) as e:
        build_environment(name, verifier, None, params)
    assert message in str(e.value)


def test_check_task_kind():
    check_task_kind("calculator", "calculator")
    check_task_kind("single_turn", "jsonl")
    with pytest.raises(ValueError, match="env 'guessing' needs task.kind in guessing, got 'arithmetic'"):
        check_task_kind("guessing", "arithmetic")
