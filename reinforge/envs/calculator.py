"""Calculator environment: the model may call a ``calc`` tool, then gives a final integer answer.

Episode: reset -> the task prompt as a user message (``"482*37="``). Each assistant turn that
contains ``<tool_call>`` blocks is a tool turn: every call runs and its result comes back as a
``tool`` message (reward 0, not done). The first turn without a tool call is the final answer:
reward 1.0 when its last integer equals the task's answer, else 0.0, and the episode ends.
More than ``max_tool_calls`` calls in total ends the episode with reward 0.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from reinforge.envs.base import Message, StepResult
from reinforge.envs.tools import Toolbox, ToolError, parse_tool_calls, tool_message
from reinforge.types import Task

if TYPE_CHECKING:
    from reinforge.envs.mcp_tools import MCPToolbox

MAX_EXPR_CHARS = 100
MAX_DIGITS = 30  # every literal, intermediate value and result stays below 10**MAX_DIGITS in size
_OPS: dict[type[ast.operator], Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_INTEGER = re.compile(r"(?<!\d)-?\d+")  # a '-' right after a digit is a minus sign, not a sign


def last_integer(text: str) -> int | None:
    """The last integer in ``text`` (``"5-3"`` -> 3, ``"=-7"`` -> -7), or None."""
    found = _INTEGER.findall(text)
    if not found:
        return None
    try:
        return int(found[-1])
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


def task_messages(task: Task, system_prompt: str | None = None) -> list[Message]:
    """The task's prompt as chat messages (raw text becomes one user message), after an optional system message."""
    prompt = [{"role": "user", "content": task.prompt}] if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
    return ([{"role": "system", "content": system_prompt}] if system_prompt is not None else []) + prompt


def _bounded(value: int) -> int:
    if abs(value) >= 10**MAX_DIGITS:
        raise ToolError(f"number too large (over {MAX_DIGITS} digits)")
    return value


def _evaluate(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _bounded(_OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    shown = ast.unparse(node)
    shown = shown if len(shown) <= 30 else shown[:30] + "..."
    raise ToolError(f"only integers, + - * and parentheses are allowed, not {shown!r}")


def evaluate(expr: str) -> int:
    """Evaluate an integer expression of + - * and parentheses from its syntax tree (never ``eval``).

    Raises `ToolError` for anything else, an expression over ``MAX_EXPR_CHARS`` characters or a
    number over ``MAX_DIGITS`` digits.
    """
    if len(expr) > MAX_EXPR_CHARS:
        raise ToolError(f"expression too long ({len(expr)} > {MAX_EXPR_CHARS} chars)")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"not an expression: {expr!r}") from None
    return _evaluate(tree.body)


def calc(expr: str) -> str:
    """Evaluate integer arithmetic with + - * and parentheses.

    Args:
        expr: The expression, e.g. 482*37
    """
    return str(evaluate(expr))


@cache
def calculator_toolbox() -> Toolbox:
    """The default toolbox: just ``calc`` (shared: a Toolbox holds no per-episode state)."""
    return Toolbox([calc])


class CalculatorEnv:
    """Tool-use arithmetic: ``calc`` calls, then a final answer scored against ``task.answer``.

    ``info`` on every step: ``tool_calls`` (calls made so far, malformed ones included) and
    ``tool_errors`` (calls whose result was an error); on the last step also ``correct``, and
    ``reason`` when the episode ended because of the tool-call limit. ``.tools.schemas`` are the
    schemas to render into the chat template. The task's answer must be an integer.
    """

    def __init__(self, toolbox: Toolbox | MCPToolbox | None = None, max_tool_calls: int = 3, system_prompt: str | None = None) -> None:
        if isinstance(max_tool_calls, bool) or not isinstance(max_tool_calls, int) or max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be an integer >= 0, got {max_tool_calls!r}")
        self.tools = toolbox if toolbox is not None else calculator_toolbox()
        self.max_tool_calls = max_tool_calls
        self.system_prompt = system_prompt
        self.task: Task | None = None

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        try:
            self.answer = int(task.answer)
        except ValueError:
            raise ValueError(f"CalculatorEnv needs an integer answer; task {task.id!r} has {task.answer!r}") from None
        self.task, self.calls, self.errors, self.done = task, 0, 0, False
        return task_messages(task, self.system_prompt)

    def step(self, assistant: Message) -> StepResult:
        if self.task is None or self.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        text = assistant.get("content") or ""
        calls = parse_tool_calls(text)
        if not calls:
            correct = self.is_correct(text)
            return self._end(float(correct), correct)
        self.calls += len(calls)
        if self.calls > self.max_tool_calls:
            return self._end(0.0, False, reason=f"too many tool calls: {self.calls} > max_tool_calls={self.max_tool_calls}")
        observation = []
        for call in calls:
            result = self.tools.call(call)
            self.errors += not result.ok
            observation.append(tool_message(result, call))
        return StepResult(observation, 0.0, False, self._info())

    def is_correct(self, text: str) -> bool:
        """The final turn is right: its last integer is the task's answer."""
        return last_integer(text) == self.answer

    def _info(self, **extra: Any) -> dict[str, Any]:
        return {"tool_calls": self.calls, "tool_errors": self.errors, **extra}

    def _end(self, reward: float, correct: bool, **extra: Any) -> StepResult:
        self.done = True
        return StepResult([], reward, True, self._info(correct=correct, **extra))
