"""The code verifier (extraction, assert and stdin/stdout tests, reward modes), also in a VerifierPool."""

from __future__ import annotations

import sys

import pytest

from reinforge.rewards.code import (
    code_tests,
    extract_code,
    run_tests,
    split_asserts,
)
from reinforge.rewards.pool import VerifierPool
from reinforge.rewards.verifiers import VERIFIERS, RewardResult
from reinforge.sandbox import SandboxLimits
from reinforge.types import Task

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")

LIMITS = SandboxLimits(timeout_s=2.0, cpu_s=2, memory_mb=256)
INC = "def f(x):\n    return x + 1\n"
DOUBLE = "import sys\nprint(2 * int(sys.stdin.read()))\n"


# --- extraction ---------------------------------------------------------------------------------


def test_extract_code_takes_the_last_python_block():
    text = "Idea:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\nDone."
    assert extract_code(text) == "print(2)\n"


def test_extract_code_prefers_python_over_untagged_and_other_languages():
    text = "```python\nprint(1)\n```\n```\nls -l\n```\n```bash\necho\n```"
    assert extract_code(text) == "print(1)\n"
    assert extract_code("```\nprint(3)\n```\n```bash\necho hi\n```") == "print(3)\n"


def test_extract_code_unclosed_fence_and_plain_text():
    assert extract_code("sure:\n```python\ndef f():\n    return 1") == "def f():\n    return 1"
    assert extract_code("print('no fence')") == "print('no fence')"


# --- assert-style tests -------------------------------------------------------------------------


def test_split_asserts_groups_setup_with_the_next_assert():
    tests = "import math\n@staticmethod\ndef g(x):\n    return x\nassert f(1) == 2\ny = 3\nassert f(y) == 4\nprint(y)"
    assert split_asserts(tests) == [
        "import math\n@staticmethod\ndef g(x):\n    return x\nassert f(1) == 2",
        "y = 3\nassert f(y) == 4\nprint(y)",
    ]


def test_split_asserts_whole_string_cases():
    check = "def check(candidate):\n    assert candidate(1) == 2\ncheck(f)"
    assert split_asserts(check) == [check]
    assert split_asserts("x = 1; assert x") == ["x = 1; assert x"]
    assert split_asserts(["assert 1", "assert 2"]) == ["assert 1", "assert 2"]
    with pytest.raises(ValueError, match="do not parse"):
        split_asserts("assert (")


def test_asserts_per_case_status_and_fraction():
    tests = "assert f(1) == 2\nassert f(2) == 4, 'two'\nassert g(1)\nassert f(0) == 1"
    result = run_tests(INC, asserts=tests, limits=LIMITS)
    assert [c.status for c in result.cases] == ["pass", "fail", "error", "pass"]
    assert result.cases[1].detail == "AssertionError: two"
    assert "NameError" in result.cases[2].detail
    assert result.reward == pytest.approx(0.5) and not result.correct
    assert result.reason.startswith("case 1 (assert) fail")
    assert result.isolation in ("bubblewrap", "unshare", "rlimits-only")


def test_mode_all_is_one_only_when_everything_passes():
    assert run_tests(INC, asserts="assert f(1) == 2\nassert f(2) == 4", mode="all", limits=LIMITS).reward == 0.0
    passing = run_tests(INC, asserts="assert f(1) == 2\nassert f(2) == 3", mode="all", limits=LIMITS)
    assert passing.reward == 1.0 and passing.correct and passing.reason == ""


def test_humaneval_style_check_function():
    tests = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 6\ncheck(f)"
    assert run_tests(INC, asserts=tests, limits=LIMITS).reward == 1.0
    assert run_tests("def f(x):\n    return x", asserts=tests, limits=LIMITS).reward == 0.0


def test_solution_that_does_not_compile_fails_every_case():
    result = run_tests("def f(x) return x", asserts=["assert f(1) == 1", "assert True"], limits=LIMITS)
    assert [c.status for c in result.cases] == ["error", "error"]
    assert "SyntaxError" in result.cases[0].detail and result.reward == 0.0


def test_exiting_early_does_not_pass_the_tests():
    for escape in ("import os\nos._exit(0)\n", "raise SystemExit(0)\n"):
        result = run_tests(INC + escape, asserts="assert f(1) == 2", limits=LIMITS)
        assert result.reward == 0.0 and result.cases[0].status == "error", result


def test_timeout_in_a_case_keeps_earlier_results():
    code = "def f(x):\n    while x == 2:\n        pass\n    return x + 1\n"
    result = run_tests(code, asserts="assert f(1) == 2\nassert f(2) == 3\nassert f(3) == 4",
                       limits=SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert [c.status for c in result.cases] == ["pass", "timeout", "timeout"]
    assert "wall-clock" in result.cases[1].detail
    assert result.reward == pytest.approx(1 / 3)


# --- stdin/stdout tests -------------------------------------------------------------------------


def test_io_cases_compare_stripped_output():
    io = [{"input": "2", "output": "4"}, {"input": "3\n", "output": "  6 \n\n"}, {"input": "4", "output": "9"}]
    result = run_tests(DOUBLE, io=io, limits=LIMITS)
    assert [c.status for c in result.cases] == ["pass", "pass", "fail"]
    assert result.cases[2].detail == "expected '9', got '8'"
    assert result.reward == pytest.approx(2 / 3)


def test_io_runtime_error_and_mode_all_skips_the_rest():
    io = [{"input": "x", "output": "1"}, {"input": "2", "output": "4"}]
    fraction = run_tests(DOUBLE, io=io, limits=LIMITS)
    assert [c.status for c in fraction.cases] == ["error", "pass"]
    assert "ValueError" in fraction.cases[0].detail
    strict = run_tests(DOUBLE, io=io, mode="all", limits=LIMITS)
    assert [c.status for c in strict.cases] == ["error", "skipped"] and strict.reward == 0.0


def test_mixed_asserts_and_io():
    code = INC + "import sys\nif __name__ == '__main__':\n    print(f(int(sys.stdin.read())))\n"
    result = run_tests(code, asserts="assert f(1) == 2", io=[{"input": "5", "output": "6"}], limits=LIMITS)
    assert [(c.kind, c.status) for c in result.cases] == [("assert", "pass"), ("io", "pass")]


def test_bad_test_specs_raise():
    with pytest.raises(ValueError, match="no test cases"):
        run_tests(INC)
    with pytest.raises(ValueError, match="mode"):
        run_tests(INC, asserts="assert True", mode="most")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'input' and 'output'"):
        run_tests(INC, io=[{"in": "1"}])


# --- the registered verifier --------------------------------------------------------------------


def _task(i: int, **meta) -> Task:
    return Task(id=f"t{i}", prompt="write f", answer="", metadata=meta)


def test_code_tests_verifier_is_registered_and_reads_task_metadata():
    assert VERIFIERS.get("code_tests") is code_tests
    task = _task(0, asserts="assert f(1) == 2\nassert f(2) == 4", reward_mode="fraction",
                 sandbox_limits={"timeout_s": 2.0})
    result = code_tests(task, f"Here you go:\n```python\n{INC}```")
    assert isinstance(result, RewardResult) and result.reward == 0.5
    with pytest.raises(ValueError, match="has no tests"):
        code_tests(_task(1), INC)


# --- the code verifier in the VerifierPool ------------------------------------------------------


def test_pool_with_the_sandboxed_code_verifier():
    tasks = [_task(i, asserts="assert f(1) == 2", sandbox_limits={"timeout_s": 1.0}) for i in range(4)]
    completions = [INC, "def f(x):\n    return x", "while True:\n    pass", "```python\n" + INC + "```"]
    with VerifierPool(code_tests, workers=2, timeout_s=10) as pool:
        outcomes = pool.score(tasks, completions)
    assert [o.reward for o in outcomes] == [1.0, 0.0, 0.0, 1.0]
    assert outcomes[2].result.cases[0].status == "timeout"  # the program's timeout is a score, not an error
    assert pool.stats == {"calls": 4, "errors": 0, "timeouts": 0}
