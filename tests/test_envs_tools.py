"""The tools layer: schemas, Hermes tool-call parsing, the Toolbox's error handling, the sandboxed
python tool, and tool schemas reaching a chat template."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from reinforge.envs.tools import (
    MalformedToolCall,
    Toolbox,
    ToolCall,
    ToolError,
    ToolResult,
    parse_tool_calls,
    python_tool,
    strip_tool_calls,
    tool_message,
    tool_schema,
)
from reinforge.sandbox import SandboxLimits

TINY_BASE = Path(__file__).resolve().parents[1] / "reinforge" / "assets" / "tiny-base"


def add(a: int, b: int = 0) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def total(values: list[int], label: str) -> str:
    """Sum a list.

    Args:
        values: The numbers.
        label: A name for the sum.
    """
    return f"{label}={sum(values)}"


def fail(reason: str) -> str:
    """Always fail.

    Args:
        reason: The message.
    """
    if reason == "tool":
        raise ToolError("no such file")
    raise ValueError(reason)


def nothing() -> None:
    """Return nothing."""


def info() -> dict:
    """Return a dict."""
    return {"x": [1, 2]}


# ---------------------------------------------------------------- schemas


def test_tool_schema_exact_dict():
    assert tool_schema(add) == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "The first number."},
                    "b": {"type": "integer", "description": "The second number."},
                },
                "required": ["a"],
            },
        },
    }


def untyped(a) -> int:  # type: ignore[no-untyped-def]
    """Untyped.

    Args:
        a: A value.
    """
    return 0


def undocumented(a: int) -> int:
    return a


def missing_arg_doc(a: int, b: int) -> int:
    """Only a is described.

    Args:
        a: A value.
    """
    return a


def star_args(*xs: int) -> int:
    """Star args.

    Args:
        xs: Values.
    """
    return 0


@pytest.mark.parametrize(
    "fn, needle",
    [
        (untyped, "missing a type hint"),
        (undocumented, "no docstring"),
        (missing_arg_doc, "no description for the argument 'b'"),
        (star_args, "named arguments only"),
        (lambda x: x, "named Python function"),
    ],
)
def test_tool_schema_rejects_untyped_or_undocumented(fn, needle):
    with pytest.raises(ValueError, match="tool") as e:
        tool_schema(fn)
    assert needle in str(e.value)


# ---------------------------------------------------------------- parsing


def test_parse_one_call_with_whitespace_and_newlines():
    text = 'let me compute\n<tool_call>\n  {"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert parse_tool_calls(text) == [ToolCall("add", {"a": 2, "b": 3})]
    assert strip_tool_calls(text) == "let me compute"


def test_parse_several_calls_in_order():
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> and '
        '<tool_call>{"name": "total", "arguments": {"values": [1, 2], "label": "s"}}</tool_call>'
        '<tool_call>{"name": "info"}</tool_call> done'
    )
    assert parse_tool_calls(text) == [
        ToolCall("add", {"a": 1}),
        ToolCall("total", {"values": [1, 2], "label": "s"}),
        ToolCall("info", {}),
    ]
    assert strip_tool_calls(text) == "and  done"


def test_no_calls():
    assert parse_tool_calls("17834") == []
    assert parse_tool_calls("a stray </tool_call> is not a call") == []
    assert strip_tool_calls(" 12 ") == "12"


@pytest.mark.parametrize(
    "body, error",
    [
        ('{"name": "add", "arguments": {"a": 1}', "invalid JSON: Expecting ',' delimiter"),
        ("[1, 2]", 'expected a JSON object {"name": ..., "arguments": {...}}, got array'),
        ('{"arguments": {"a": 1}}', 'missing "name" (a non-empty string)'),
        ('{"name": 5}', 'missing "name" (a non-empty string)'),
        ('{"name": "add", "arguments": "{\\"a\\": 1}"}', '"arguments" must be a JSON object, got string'),
        ('{"name": "add", "arguments": [1]}', '"arguments" must be a JSON object, got array'),
    ],
)
def test_parse_malformed(body, error):
    raw = f"<tool_call>{body}</tool_call>"
    (call,) = parse_tool_calls(f"x {raw} y")
    assert isinstance(call, MalformedToolCall)
    assert call.raw == raw
    assert call.error.startswith(error)


def test_parse_unclosed_tag():
    assert parse_tool_calls('ok <tool_call>{"name": "add"') == [
        MalformedToolCall('<tool_call>{"name": "add"', "unclosed <tool_call>: no </tool_call> after it")
    ]
    assert strip_tool_calls('ok <tool_call>{"name": "add"') == "ok"
    # an unclosed block followed by a complete one: both are reported, in order
    calls = parse_tool_calls('<tool_call>{"na <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    assert calls == [
        MalformedToolCall('<tool_call>{"na ', "unclosed <tool_call>: no </tool_call> after it"),
        ToolCall("add", {"a": 1}),
    ]


# ---------------------------------------------------------------- Toolbox


@pytest.fixture
def box() -> Toolbox:
    return Toolbox([add, total, fail, nothing, info])


def test_toolbox_schemas_and_successful_calls(box):
    assert box.names == ["add", "total", "fail", "nothing", "info"]
    assert [s["function"]["name"] for s in box.schemas] == box.names
    box.schemas[0]["function"]["name"] = "mutated"  # a copy: the toolbox is unchanged
    assert box.schemas[0]["function"]["name"] == "add"
    assert box.call(ToolCall("add", {"a": 2, "b": 40})) == ToolResult("42", True)
    assert box.call(ToolCall("add", {"a": 2})) == ToolResult("2", True)
    assert box.call(ToolCall("total", {"values": [1, 2, 3], "label": "s"})) == ToolResult("s=6", True)
    assert box.call(ToolCall("nothing", {})) == ToolResult("(no output)", True)
    assert box.call(ToolCall("info", {})) == ToolResult('{"x": [1, 2]}', True)


def test_toolbox_unknown_and_malformed(box):
    assert box.call(ToolCall("nope", {})) == ToolResult(
        "error: unknown tool 'nope'; available: add, total, fail, nothing, info", False
    )
    bad = MalformedToolCall("<tool_call>[1]</tool_call>", "expected a JSON object")
    assert box.call(bad) == ToolResult("error: malformed tool call: expected a JSON object", False)


@pytest.mark.parametrize(
    "name, arguments, message",
    [
        ("add", {}, "error: bad arguments for add: missing required argument 'a'"),
        ("add", {"a": 1, "c": 2}, "error: bad arguments for add: unexpected argument 'c' (takes: a, b)"),
        ("add", {"a": "1"}, "error: bad arguments for add: argument 'a': Input should be a valid integer (got '1')"),
        ("add", {"a": True}, "error: bad arguments for add: argument 'a': Input should be a valid integer (got True)"),
        ("add", {"a": 1.5}, "error: bad arguments for add: argument 'a': Input should be a valid integer (got 1.5)"),
        (
            "total",
            {"values": [1, "x"], "label": "s"},
            "error: bad arguments for total: argument 'values'[1]: Input should be a valid integer (got [1, 'x'])",
        ),
        (
            "info",
            {"z": 1},
            "error: bad arguments for info: unexpected argument 'z' (takes: nothing)",
        ),
    ],
)
def test_toolbox_bad_arguments_name_the_argument(box, name, arguments, message):
    assert box.call(ToolCall(name, arguments)) == ToolResult(message, False)


def test_toolbox_tool_exceptions_become_errors(box):
    assert box.call(ToolCall("fail", {"reason": "boom"})) == ToolResult("error: ValueError: boom", False)
    assert box.call(ToolCall("fail", {"reason": "tool"})) == ToolResult("error: no such file", False)


def test_toolbox_timeout():
    release = threading.Event()

    def hang(seconds: float) -> str:
        """Block.

        Args:
            seconds: Upper bound.
        """
        release.wait(seconds)
        return "late"

    box = Toolbox([hang], timeout_s=0.2)
    start = time.monotonic()
    try:
        result = box.call(ToolCall("hang", {"seconds": 30}))
        elapsed = time.monotonic() - start
    finally:
        release.set()  # let the abandoned thread finish
    assert result == ToolResult("error: timed out after 0.2s", False)
    assert 0.15 < elapsed < 2.0


def test_toolbox_caps_output_and_rejects_duplicates():
    def shout(n: int) -> str:
        """Repeat x.

        Args:
            n: How many.
        """
        return "x" * n

    box = Toolbox([shout], max_output_chars=10)
    assert box.call(ToolCall("shout", {"n": 25})) == ToolResult("xxxxxxxxxx... [15 more chars]", True)
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        Toolbox([add, add])
    with pytest.raises(ValueError, match="timeout_s"):
        Toolbox([add], timeout_s=0)


def test_tool_message():
    call = ToolCall("add", {"a": 1})
    assert tool_message(ToolResult("1", True), call) == {"role": "tool", "content": "1", "name": "add"}
    bad = MalformedToolCall("<tool_call>x</tool_call>", "invalid JSON")
    assert tool_message(ToolResult("error: x", False), bad) == {"role": "tool", "content": "error: x"}


# ---------------------------------------------------------------- sandboxed python tool


def _sandbox_backends() -> list[str]:
    if not sys.platform.startswith("linux"):
        return []
    from reinforge.sandbox import available_backends

    return available_backends()


needs_sandbox = pytest.mark.skipif(not _sandbox_backends(), reason="no sandbox backend works on this machine")


@needs_sandbox
def test_python_tool_runs_in_the_sandbox():
    python = python_tool(SandboxLimits(timeout_s=2.0, cpu_s=2.0, memory_mb=256))
    box = Toolbox([python], timeout_s=5.0)
    assert box.schemas[0]["function"]["parameters"]["properties"]["code"]["type"] == "string"
    assert box.call(ToolCall("python", {"code": "print(482*37)"})) == ToolResult("17834\n", True)
    pid = box.call(ToolCall("python", {"code": "import os; print(os.getpid())"}))
    assert pid.ok and int(pid.content) != os.getpid()  # another process, never in-process
    assert box.call(ToolCall("python", {"code": "x = 1"})) == ToolResult("(no output)", True)
    crash = box.call(ToolCall("python", {"code": "print('a'); 1/0"}))
    assert crash == ToolResult("error: exited with code 1: ZeroDivisionError: division by zero\nstdout:\na\n", False)
    slow = box.call(ToolCall("python", {"code": "while True: pass"}))
    assert not slow.ok and "timeout" in slow.content


# ---------------------------------------------------------------- chat template

QWEN_LIKE_TEMPLATE = (  # the tool parts of Qwen2.5's template (HF renders with trim_blocks: newlines as strings)
    "{%- if tools %}{{ '<|im_start|>system\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools><|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_chat_template_receives_tool_schemas():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY_BASE)
    tokenizer.chat_template = QWEN_LIKE_TEMPLATE
    box = Toolbox([add])
    call = '<tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>'
    (parsed,) = parse_tool_calls(call)
    messages = [
        {"role": "user", "content": "2+0="},
        {"role": "assistant", "content": call},
        tool_message(box.call(parsed), parsed),
    ]
    text = tokenizer.apply_chat_template(messages, tools=box.schemas, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\n<tools>\n"
        '{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": '
        '{"type": "object", "properties": {"a": {"type": "integer", "description": "The first number."}, '
        '"b": {"type": "integer", "description": "The second number."}}, "required": ["a"]}}}\n'
        "</tools><|im_end|>\n"
        "<|im_start|>user\n2+0=<|im_end|>\n"
        f"<|im_start|>assistant\n{call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
