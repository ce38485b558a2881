"""Tools for agent environments: JSON schemas, Hermes-format tool-call parsing, and a `Toolbox`
that runs calls safely (argument checks, timeouts, errors as text for the model).

A tool is a plain Python function with a type hint on every argument and a Google-style
docstring (``Args:`` describes each argument). The model calls tools in the Hermes / Qwen format
that chat templates teach it::

    <tool_call>
    {"name": "calc", "arguments": {"expr": "482*37"}}
    </tool_call>

Nothing here raises on bad model output: a malformed call, an unknown tool, bad arguments, an
exception inside the tool or a timeout all become a `ToolResult` with ``ok=False`` and an
``error: ...`` message that is shown to the model. Code written by the model only ever runs in
`reinforge.sandbox` (see `python_tool`).
"""

from __future__ import annotations

import copy
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import TypeAdapter, ValidationError
from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

from reinforge.envs.base import Message
from reinforge.sandbox import SandboxLimits, best_backend, run_python

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ToolError(Exception):
    """Raised by a tool to report a failure to the model as ``error: <message>`` (no exception type)."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedToolCall:
    """A ``<tool_call>`` block that could not be read; ``raw`` is its text, ``error`` says why."""

    raw: str
    error: str


@dataclass(frozen=True)
class ToolResult:
    content: str
    ok: bool


# ---------------------------------------------------------------- schemas


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool schema ``{"type": "function", "function": {name, description, parameters}}``
    of a typed function with a Google-style docstring (via ``transformers.utils.get_json_schema``;
    the return type is left out: chat templates do not show it and it costs context).

    Raises ``ValueError`` naming the function and what is missing when it cannot be described.
    """
    name = getattr(fn, "__name__", None)
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) or not name or name == "<lambda>":
        raise ValueError(f"a tool must be a named Python function (def), got {fn!r}")
    for param in inspect.signature(fn).parameters.values():
        if param.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            raise ValueError(
                f"tool {name!r}: argument {param.name!r} is {param.kind.description}; "
                "tools take named arguments only (no *args, **kwargs or positional-only)"
            )
    try:
        schema = get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as e:
        raise ValueError(
            f"cannot make a tool schema for {name!r}: {e}. A tool needs a type hint on every argument and "
            "a Google-style docstring: a description line, then 'Args:' with one 'name: description' line per argument"
        ) from None
    function = schema["function"]
    function.pop("return", None)
    if not function.get("description"):
        raise ValueError(f"tool {name!r}: its docstring needs a description line before 'Args:'")
    return schema


def _argument_checkers(fn: Callable[..., Any]) -> tuple[dict[str, TypeAdapter], frozenset[str]]:
    """A strict pydantic validator per argument, and the names of the required arguments."""
    hints = get_type_hints(fn)
    params = inspect.signature(fn).parameters
    adapters = {name: TypeAdapter(hints[name]) for name in params}
    required = frozenset(n for n, p in params.items() if p.default is inspect.Parameter.empty)
    return adapters, required


# ---------------------------------------------------------------- parsing


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _read_call(body: str, raw: str) -> ToolCall | MalformedToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return MalformedToolCall(raw, f"invalid JSON: {e}")
    if not isinstance(data, dict):
        return MalformedToolCall(raw, f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {_json_type(data)}')
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return MalformedToolCall(raw, 'missing "name" (a non-empty string)')
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        return MalformedToolCall(raw, f'"arguments" must be a JSON object, got {_json_type(arguments)}')
    return ToolCall(name, arguments)


def split_tool_calls(text: str) -> tuple[list[ToolCall | MalformedToolCall], list[str]]:
    """The tool calls in ``text`` in order, and the pieces of text outside them."""
    calls: list[ToolCall | MalformedToolCall] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) != -1:
        outside.append(text[pos:start])
        body_start = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_start)
        reopen = text.find(OPEN_TAG, body_start)
        if end == -1 or reopen != -1 and reopen < end:
            stop = len(text) if reopen == -1 else reopen
            calls.append(MalformedToolCall(text[start:stop], f"unclosed {OPEN_TAG}: no {CLOSE_TAG} after it"))
            pos = stop
            continue
        pos = end + len(CLOSE_TAG)
        calls.append(_read_call(text[body_start:end], text[start:pos]))
    outside.append(text[pos:])
    return calls, outside


def parse_tool_calls(text: str) -> list[ToolCall | MalformedToolCall]:
    """Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block in ``text``, in order.

    Whitespace around the JSON is allowed; ``arguments`` may be omitted (no arguments). A block
    with invalid JSON, no ``name``, non-object ``arguments`` or no closing tag is a `MalformedToolCall`.
    """
    return split_tool_calls(text)[0]


def strip_tool_calls(text: str) -> str:
    """``text`` without its tool-call blocks (an unclosed block runs to the end of the text), stripped."""
    return "".join(split_tool_calls(text)[1]).strip()


# ---------------------------------------------------------------- running


def _as_text(value: Any) -> str:
    if value is None:
        return "(no output)"
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}... [{len(text) - max_chars} more chars]"


class Toolbox:
    """A fixed set of tools: their schemas for the chat template, and `call`, which never raises.

    Each call runs in a fresh daemon thread and is abandoned after ``timeout_s``. Python cannot
    kill a thread, so a pure-Python tool that never returns keeps its thread (and whatever it
    holds) until it finishes or the process exits; tools that can hang should bound their own
    work, and anything that runs model-written code must go through the sandbox (`python_tool`),
    whose subprocess is killed at its own deadline. Results longer than ``max_output_chars`` are cut.
    """

    def __init__(self, tools: Sequence[Callable[..., Any]], timeout_s: float = 5.0, max_output_chars: int = 1000) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_output_chars < 1:
            raise ValueError(f"max_output_chars must be >= 1, got {max_output_chars!r}")
        self.timeout_s = float(timeout_s)
        self.max_output_chars = max_output_chars
        self._tools: dict[str, Callable[..., Any]] = {}
        self._schemas: list[dict[str, Any]] = []
        self._checkers: dict[str, tuple[dict[str, TypeAdapter], frozenset[str]]] = {}
        for fn in tools:
            schema = tool_schema(fn)
            name = schema["function"]["name"]
            if name in self._tools:
                raise ValueError(f"two tools are named {name!r}; tool names must be unique")
            self._tools[name] = fn
            self._schemas.append(schema)
            self._checkers[name] = _argument_checkers(fn)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tool schemas, for ``tokenizer.apply_chat_template(messages, tools=...)`` (a fresh copy)."""
        return copy.deepcopy(self._schemas)

    def call(self, call: ToolCall | MalformedToolCall) -> ToolResult:
        """Run one call; every failure is an ``error: ...`` result, never an exception."""
        if isinstance(call, MalformedToolCall):
            return ToolResult(f"error: malformed tool call: {call.error}", False)
        fn = self._tools.get(call.name)
        if fn is None:
            return ToolResult(f"error: unknown tool {call.name!r}; available: {', '.join(self._tools)}", False)
        kwargs = self._checked_arguments(call)
        if isinstance(kwargs, str):
            return ToolResult(f"error: bad arguments for {call.name}: {kwargs}", False)
        return self._run(fn, kwargs)

    def _checked_arguments(self, call: ToolCall) -> dict[str, Any] | str:
        """The validated arguments, or a message naming every bad argument."""
        adapters, required = self._checkers[call.name]
        problems = [f"unexpected argument {k!r} (takes: {', '.join(adapters) or 'nothing'})" for k in call.arguments if k not in adapters]
        problems += [f"missing required argument {k!r}" for k in adapters if k in required and k not in call.arguments]
        kwargs: dict[str, Any] = {}
        for key, value in call.arguments.items():
            if key not in adapters:
                continue
            try:
                kwargs[key] = adapters[key].validate_python(value, strict=True)
            except ValidationError as e:
                first = e.errors()[0]
                where = "".join(f"[{p!r}]" for p in first["loc"])
                problems.append(f"argument {key!r}{where}: {first['msg']} (got {_cap(repr(value), 40)})")
        return "; ".join(problems) if problems else kwargs

    def _run(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> ToolResult:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn(**kwargs)
            except BaseException as e:  # reported to the model, never raised
                box["error"] = e

        worker = threading.Thread(target=target, name=f"tool-{fn.__name__}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return ToolResult(f"error: timed out after {self.timeout_s:g}s", False)
        if "error" in box:
            e = box["error"]
            message = str(e) if isinstance(e, ToolError) else f"{type(e).__name__}: {e}"
            return ToolResult(_cap(f"error: {message}", self.max_output_chars), False)
        return ToolResult(_cap(_as_text(box.get("value")), self.max_output_chars), True)


def tool_message(result: ToolResult, call: ToolCall | MalformedToolCall) -> Message:
    """The ``{"role": "tool", "content": ..., "name": ...}`` message for a result (no name for a malformed call)."""
    message: Message = {"role": "tool", "content": result.content}
    if isinstance(call, ToolCall):
        message["name"] = call.name
    return message


# ---------------------------------------------------------------- code execution

DEFAULT_PYTHON_LIMITS = SandboxLimits(timeout_s=3.0, cpu_s=3.0, memory_mb=256, output_bytes=64 << 10)


def python_tool(limits: SandboxLimits | None = None, max_output_chars: int = 1000) -> Callable[[str], str]:
    """A ``python(code)`` tool that runs model-written code in `reinforge.sandbox` (never in-process).

    It returns the program's stdout (``(no output)`` when empty); a failed run raises `ToolError`
    with the sandbox's one-line reason (and the stdout so far), so the model sees ``error: ...``.
    The strongest sandbox backend is chosen now, so a machine where none works fails here
    (``SandboxError``), not in the middle of training. Keep ``limits.timeout_s`` below the
    `Toolbox` timeout so the sandbox, not the toolbox, ends a long run.
    """
    limits = limits or DEFAULT_PYTHON_LIMITS
    backend = best_backend()

    def python(code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: A complete Python program; print the values you need.
        """
        result = run_python(code, limits=limits, backend=backend)
        stdout = _cap(result.stdout, max_output_chars)
        if not result.ok:
            raise ToolError(f"{result.reason}\nstdout:\n{stdout}" if stdout else result.reason)
        return stdout or "(no output)"

    return python
