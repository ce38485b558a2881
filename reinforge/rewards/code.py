"""The code verifier: run model-written Python against unit tests in the sandbox.

Two kinds of test case, which may be mixed:
- assert-style: Python run after the solution in its namespace (``asserts``). A string is split
  into one case per top-level ``assert`` (the statements before an assert are that case's
  setup); a string without top-level asserts (HumanEval's ``def check(...)`` + ``check(f)``) is
  one case; a list gives the cases explicitly. All assert cases share one sandbox run.
- stdin/stdout: ``{"input": ..., "output": ...}``; one sandbox run per case, passing when the
  program exits 0 and its output equals the expected one up to surrounding whitespace and
  trailing spaces on each line.

The reward is the fraction of cases passed (``mode="fraction"``) or 1/0 for all passed
(``mode="all"``). Limits of the assert harness: the solution runs in the same process as the
test code, so a determined policy can forge results (read the harness, patch ``__eq__``);
stdin/stdout cases are compared outside the sandbox and cannot be forged that way.

``reinforge.rewards.pool.VerifierPool`` scores many completions in parallel with per-call timeouts.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from reinforge.rewards.verifiers import VERIFIERS, RewardResult
from reinforge.sandbox import Isolation, SandboxLimits, SandboxResult, run_python
from reinforge.types import Task

log = logging.getLogger(__name__)

Mode = Literal["fraction", "all"]
CaseStatus = Literal["pass", "fail", "error", "timeout", "memory", "output_limit", "killed", "skipped"]
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = {"python", "py", "python3"}
_SOLUTION = "solution.py"


def extract_code(completion: str) -> str:
    """The last ```python (or ```py) fenced block; else the last untagged fenced block; else the
    whole completion. An unclosed final fence (a truncated completion) runs to the end."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(completion)]
    for wanted in (lambda t: t in _PYTHON_TAGS, lambda t: t == ""):
        chosen = [body for tag, body in blocks if wanted(tag)]
        if chosen:
            return chosen[-1]
    return completion


@dataclass(frozen=True)
class CaseResult:
    """One test case: ``kind`` is ``assert`` or ``io``; ``detail`` says why it did not pass."""

    kind: Literal["assert", "io"]
    status: CaseStatus
    detail: str = ""


@dataclass(frozen=True)
class CodeRewardResult(RewardResult):
    """A ``RewardResult`` with the per-case statuses, the first failure's reason and the isolation used."""

    cases: tuple[CaseResult, ...] = ()
    reason: str = ""
    isolation: str = ""


def split_asserts(tests: str | Sequence[str]) -> list[str]:
    """Assert-style test source -> one source per case (see the module docstring)."""
    if not isinstance(tests, str):
        return [str(t) for t in tests]
    try:
        tree = ast.parse(tests)
    except SyntaxError as exc:
        raise ValueError(f"the assert tests do not parse: {exc}") from exc
    lines = tests.splitlines()
    spans = [(min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]), node.end_lineno or node.lineno)
             for node in tree.body]
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:], strict=False)):  # statements sharing a line: keep them whole
        return [tests]
    cases, setup = [], []
    for node, (first, last) in zip(tree.body, spans, strict=True):
        setup.append("\n".join(lines[first - 1 : last]))
        if isinstance(node, ast.Assert):
            cases.append("\n".join(setup))
            setup = []
    if not cases:
        return [tests]
    if setup:  # statements after the last assert belong to it
        cases[-1] += "\n" + "\n".join(setup)
    return cases


_HARNESS = """\
import json as _rf_json
import os as _rf_os
_RF_NONCE = {nonce!r}
_RF_CASES = {cases!r}

def _rf_report(index, status, detail=''):
    line = '\\n%s %s %s %s\\n' % (_RF_NONCE, index, status, _rf_json.dumps(str(detail)[:300]))
    _rf_os.write(1, line.encode('utf-8', 'replace'))

_rf_ns = {{'__name__': 'solution'}}
try:
    with open({solution!r}) as _rf_f:
        exec(compile(_rf_f.read(), {solution!r}, 'exec'), _rf_ns)
except BaseException as _rf_e:
    _rf_report('solution', 'error', '%s: %s' % (type(_rf_e).__name__, _rf_e))
    raise
for _rf_i, _rf_src in enumerate(_RF_CASES):
    try:
        exec(compile(_rf_src, '<test %d>' % _rf_i, 'exec'), _rf_ns)
    except AssertionError as _rf_e:
        _rf_report(_rf_i, 'fail', 'AssertionError: %s' % (_rf_e,) if str(_rf_e) else 'AssertionError')
    except BaseException as _rf_e:
        _rf_report(_rf_i, 'error', '%s: %s' % (type(_rf_e).__name__, _rf_e))
    else:
        _rf_report(_rf_i, 'pass')
"""


def _run_asserts(code: str, cases: list[str], limits: SandboxLimits, backend: Isolation | None
                 ) -> tuple[list[CaseResult], SandboxResult]:
    nonce = secrets.token_hex(12)
    program = _HARNESS.format(nonce=nonce, cases=cases, solution=_SOLUTION)
    result = run_python(program, limits=limits, files={_SOLUTION: code}, backend=backend)
    reported: dict[str, tuple[str, str]] = {}
    for line in result.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[0] == nonce and parts[2] in ("pass", "fail", "error"):
            try:
                reported[parts[1]] = (parts[2], str(json.loads(parts[3])))
            except ValueError:
                continue
    if "solution" in reported:
        return [CaseResult("assert", "error", f"the solution raised {reported['solution'][1]}")] * len(cases), result
    out = []
    for i in range(len(cases)):
        if str(i) in reported:
            status, detail = reported[str(i)]
            out.append(CaseResult("assert", status, detail))  # type: ignore[arg-type]
        elif result.status in ("ok", "error"):
            out.append(CaseResult("assert", "error", f"no result: the program ended first ({result.reason})"))
        else:
            out.append(CaseResult("assert", result.status, result.reason))
    return out, result


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _run_io(code: str, case: Mapping[str, str], limits: SandboxLimits, backend: Isolation | None
            ) -> tuple[CaseResult, SandboxResult]:
    if "input" not in case or "output" not in case:
        raise ValueError(f"a stdin/stdout case needs 'input' and 'output' keys, got {sorted(case)}")
    result = run_python(code, stdin=str(case["input"]), limits=limits, backend=backend)
    if result.status != "ok":
        return CaseResult("io", result.status, result.reason), result
    got, expected = _normalize(result.stdout), _normalize(str(case["output"]))
    if got == expected:
        return CaseResult("io", "pass"), result
    return CaseResult("io", "fail", f"expected {expected[:100]!r}, got {got[:100]!r}"), result


def run_tests(
    code: str,
    *,
    asserts: str | Sequence[str] | None = None,
    io: Sequence[Mapping[str, str]] | None = None,
    mode: Mode = "fraction",
    limits: SandboxLimits = SandboxLimits(),
    backend: Isolation | None = None,
) -> CodeRewardResult:
    """Run ``code`` against the assert cases and the stdin/stdout cases; reward per ``mode``.

    With ``mode="all"`` the stdin/stdout cases stop at the first failure (the rest are
    ``skipped``). Raises ValueError for malformed tests (there is no case, a bad mode, ...).
    """
    if mode not in ("fraction", "all"):
        raise ValueError(f"mode must be 'fraction' or 'all', got {mode!r}")
    assert_cases = split_asserts(asserts) if asserts is not None else []
    io_cases = list(io or [])
    if not assert_cases and not io_cases:
        raise ValueError("no test cases: give asserts and/or io cases")
    cases: list[CaseResult] = []
    isolation = ""
    if assert_cases:
        results, run = _run_asserts(code, assert_cases, limits, backend)
        cases += results
        isolation = run.isolation
    for case in io_cases:
        if mode == "all" and any(c.status != "pass" for c in cases):
            cases.append(CaseResult("io", "skipped", "an earlier case failed"))
            continue
        result, run = _run_io(code, case, limits, backend)
        cases.append(result)
        isolation = run.isolation
    passed = sum(c.status == "pass" for c in cases)
    all_passed = passed == len(cases)
    reward = passed / len(cases) if mode == "fraction" else float(all_passed)
    first_failure = next((f"case {i} ({c.kind}) {c.status}: {c.detail}" for i, c in enumerate(cases)
                          if c.status not in ("pass", "skipped")), "")
    return CodeRewardResult(reward, all_passed, cases=tuple(cases), reason=first_failure, isolation=isolation)


@VERIFIERS.register(
    "code_tests",
    formula="r = fraction of unit tests passed (or 1 if all pass, 0 otherwise) by the completion's code, run sandboxed",
    paper="-",
)
def code_tests(task: Task, completion: str) -> CodeRewardResult:
    """Verifier: tests from ``task.metadata`` (``asserts``: str or list; ``io``: list of
    ``{"input", "output"}``), ``reward_mode`` ("fraction" default, or "all"), optional
    ``sandbox_limits`` (a dict of ``SandboxLimits`` fields)."""
    meta = task.metadata
    if "asserts" not in meta and "io" not in meta:
        raise ValueError(f"task {task.id!r} has no tests: its metadata needs 'asserts' and/or 'io'")
    limits = SandboxLimits(**meta["sandbox_limits"]) if "sandbox_limits" in meta else SandboxLimits()
    return run_tests(
        extract_code(completion), asserts=meta.get("asserts"), io=meta.get("io"),
        mode=meta.get("reward_mode", "fraction"), limits=limits,
    )
