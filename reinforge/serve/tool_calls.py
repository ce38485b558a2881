"""OpenAI function calling over a model that writes its tool calls as text.

A chat template teaches the model a text format for tool calls; a *tool-call parser* (registered
by name in ``TOOL_PARSERS``; ``reinforge serve --tool-parser``) reads that format back:

* replies: the calls in a completion become ``message.tool_calls`` (``call_<hex>`` ids, the function
  name, the arguments as a JSON string) with ``finish_reason: "tool_calls"`` and ``content`` the text
  outside the call blocks (None when that is only whitespace). A completion with a malformed call
  block (invalid JSON, no name, no closing tag) is returned as plain ``content`` with its own finish
  reason: nothing was called;
* requests: ``tool_choice`` ``auto`` (the default with tools) parses replies; ``none`` keeps the tools
  in the prompt (so a multi-turn context stays append-only) but never parses a reply; ``required``
  starts the assistant turn with the call tag, and a named function with the call tag and the name
  (the forced text is part of the prompt; the reply includes it); ``parallel_tool_calls: false``
  ends generation after the first call block. ``required`` / named cannot force a *well-formed*
  call: a malformed one still comes back as content;
* an assistant message's ``tool_calls`` are rendered by the chat template with their arguments as
  objects (the Hugging Face convention), so an agent's echoed turn renders as the model wrote it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from reinforge.envs.tools import CLOSE_TAG, OPEN_TAG, ToolCall, split_tool_calls
from reinforge.errors import ConfigError

Message = dict[str, Any]


class ToolCallParser(Protocol):
    """Reads the tool calls a chat template's format puts in a completion."""

    open_tag: str
    close_tag: str

    def parse(self, text: str) -> tuple[list[ToolCall], str] | None:
        """The calls in ``text`` and the text outside them; None if a call block is malformed."""

    def forced_prefix(self, function: str | None) -> str:
        """The text that starts a turn which must call a tool (``function``: that one)."""


TOOL_PARSERS: dict[str, Callable[[], ToolCallParser]] = {}


def register_tool_parser(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        TOOL_PARSERS[name] = cls
        return cls

    return deco


def tool_parser(name: str | None) -> ToolCallParser | None:
    """The parser registered as ``name`` (None or ``"none"``: replies are never parsed)."""
    if name in (None, "none"):
        return None
    if name not in TOOL_PARSERS:
        raise ConfigError(f"tool_parser: unknown tool-call parser {name!r}; allowed: none, {', '.join(sorted(TOOL_PARSERS))}")
    return TOOL_PARSERS[name]()


@register_tool_parser("hermes")
class HermesToolParser:
    """Hermes / Qwen2.5 format: ``<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>``
    (whitespace around the JSON allowed), the format of the shipped tiny-agent model."""

    open_tag, close_tag = OPEN_TAG, CLOSE_TAG

    def parse(self, text: str) -> tuple[list[ToolCall], str] | None:
        calls, outside = split_tool_calls(text)
        if not all(isinstance(c, ToolCall) for c in calls):
            return None
        return calls, "".join(outside)  # type: ignore[return-value]

    def forced_prefix(self, function: str | None) -> str:
        return self.open_tag if function is None else f'{self.open_tag}{{"name": {json.dumps(function)}, "arguments": '


def openai_tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """``[{"id": "call_<hex>", "type": "function", "function": {"name", "arguments": JSON string}}]``."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]


def choice_function(tool_choice: str | dict[str, Any] | None) -> str | None:
    """The function a named ``tool_choice`` asks for."""
    return tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None


@dataclass(frozen=True)
class ToolUse:
    """How one chat request uses tools: what is forced into the prompt and how the reply is read.

    ``parser`` None: replies are plain text (no tools, ``tool_choice: none``, or no parser)."""

    parser: ToolCallParser | None = None
    prefix: str = ""
    single_call: bool = False
    function: str | None = None

    @classmethod
    def of(cls, tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
           parallel_tool_calls: bool | None, parser: ToolCallParser | None) -> ToolUse:
        if not tools or tool_choice == "none" or parser is None:
            return cls()
        function = choice_function(tool_choice)
        forced = tool_choice == "required" or function is not None
        return cls(parser, parser.forced_prefix(function) if forced else "", parallel_tool_calls is False, function)

    def stops(self) -> tuple[str, ...]:
        """Extra stop strings of the generation (the close tag when one call is allowed)."""
        return (self.parser.close_tag,) if self.parser is not None and self.single_call else ()

    def visible_text(self, generated: str, finish_reason: str, user_stops: tuple[str, ...]) -> str:
        """The forced prefix + the generated text, cut before the first of the user's stop strings
        (OpenAI semantics) or just after the first call block when one call is allowed."""
        full = self.prefix + generated
        cuts = [i for s in user_stops if (i := full.find(s, len(self.prefix))) >= 0] if finish_reason == "stop" else []
        if self.stops() and (i := full.find(self.stops()[0])) >= 0:
            cuts.append(i + len(self.stops()[0]))
        return full[: min(cuts, default=len(full))]

    def reply(self, text: str, finish_reason: str) -> tuple[Message, str]:
        """The assistant message and finish reason for the visible text of a completion."""
        parsed = self.parser.parse(text) if self.parser is not None else None
        if not parsed or not parsed[0] or (self.function and any(c.name != self.function for c in parsed[0])):
            return {"role": "assistant", "content": text}, finish_reason
        calls, content = parsed
        return {"role": "assistant", "content": content if content.strip() else None,
                "tool_calls": openai_tool_calls(calls)}, "tool_calls"

    def content_end(self, text: str) -> int:
        """Streaming: how much of ``text`` may be sent as content so far (up to a call block, or a
        possible start of one at the end)."""
        if self.parser is None:
            return len(text)
        tag = self.parser.open_tag
        if (i := text.find(tag)) >= 0:
            return i
        partial = next((k for k in range(min(len(tag) - 1, len(text)), 0, -1) if text.endswith(tag[:k])), 0)
        return len(text) - partial


def template_messages(messages: list[Message]) -> list[Message]:
    """Messages for ``apply_chat_template``: assistant ``tool_calls`` arguments as objects (the
    request schema has checked that they are JSON objects)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                     for c in m["tool_calls"]]}
        out.append(m)
    return out


def same_reply(echoed: Message, ours: Message) -> str | None:
    """None if the agent's echoed assistant message is the reply we returned (content, and the tool
    calls' ids, names and arguments as JSON values); else what differs."""
    if echoed.get("role") != "assistant":
        return f"expected the assistant reply, got role {echoed.get('role')!r}"
    if (echoed.get("content") or "") != (ours.get("content") or ""):
        return "its content differs from the reply"
    mine, theirs = ours.get("tool_calls") or [], echoed.get("tool_calls") or []
    if len(mine) != len(theirs):
        return f"it has {len(theirs)} tool call(s), the reply had {len(mine)}"
    for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        fa, fb = a["function"], b.get("function", {})
        if b.get("id") != a["id"] or fb.get("name") != fa["name"] or _loads(fb.get("arguments")) != json.loads(fa["arguments"]):
            return f"tool call {k} differs from the reply's ({a['id']} {fa['name']}({fa['arguments']}))"
    return None


def _loads(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments
