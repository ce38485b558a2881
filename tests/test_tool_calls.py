"""Reading tool calls out of completions (reinforge/serve/tool_calls.py), without a server."""

from __future__ import annotations

import json

import pytest

from reinforge.errors import ConfigError
from reinforge.serve.tool_calls import (
    HermesToolParser,
    ToolUse,
    same_reply,
    template_messages,
    tool_parser,
)

TOOLS = [{"type": "function", "function": {"name": "calc"}}, {"type": "function", "function": {"name": "search"}}]
CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>'


def _auto() -> ToolUse:
    return ToolUse.of(TOOLS, None, None, HermesToolParser())


def test_a_call_becomes_tool_calls_and_the_rest_content():
    message, finish = _auto().reply(f"Let me compute. {CALL}", "stop")
    assert finish == "tool_calls" and message["content"] == "Let me compute. "
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["function"] == {"name": "calc", "arguments": '{"expr": "2*3"}'}


def test_only_whitespace_outside_the_calls_is_no_content_and_calls_keep_their_order():
    second = '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>'
    message, finish = _auto().reply(f"\n{CALL}\n{second}\n", "stop")
    assert finish == "tool_calls" and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["calc", "search"]
    assert len({c["id"] for c in message["tool_calls"]}) == 2


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "calc", "arguments": {"e"xpr"::x}}</tool_call>',  # invalid JSON
    '<tool_call>{"arguments": {}}</tool_call>',                              # no name
    '<tool_call>{"name": "calc", "arguments": "2*3"}</tool_call>',           # arguments not an object
    '<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}',             # cut by max_tokens: no close tag
    f'{CALL}<tool_call>["calc"]</tool_call>',                                # one good call, one malformed
])
def test_a_malformed_call_leaves_the_text_as_content_and_calls_nothing(text):
    message, finish = _auto().reply(text, "length")
    assert message == {"role": "assistant", "content": text} and finish == "length"


def test_plain_text_and_no_tools_are_plain_replies():
    assert _auto().reply("17834", "stop") == ({"role": "assistant", "content": "17834"}, "stop")
    for use in (ToolUse.of(None, None, None, HermesToolParser()), ToolUse.of(TOOLS, "none", None, HermesToolParser()),
                ToolUse.of(TOOLS, "auto", None, None)):
        assert use.reply(CALL, "stop") == ({"role": "assistant", "content": CALL}, "stop")


def test_required_and_named_choices_force_the_start_of_the_call():
    assert ToolUse.of(TOOLS, "required", None, HermesToolParser()).prefix == "<tool_call>"
    named = ToolUse.of(TOOLS, {"type": "function", "function": {"name": "calc"}}, None, HermesToolParser())
    assert named.prefix == '<tool_call>{"name": "calc", "arguments": '
    # the reply is the forced prefix + what the model generated
    assert named.visible_text('{"expr": "2*3"}}</tool_call><eos-text>', "length", ()) == CALL + "<eos-text>"
    message, finish = named.reply(named.visible_text('{"expr": "2*3"}}</tool_call>', "stop", ()), "stop")
    assert finish == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "calc"
    # a named choice whose call names another function called nothing
    other = ToolUse.of(TOOLS, {"type": "function", "function": {"name": "search"}}, None, HermesToolParser())
    assert other.reply(CALL, "stop") == ({"role": "assistant", "content": CALL}, "stop")


def test_parallel_tool_calls_false_stops_after_the_first_call():
    single = ToolUse.of(TOOLS, None, False, HermesToolParser())
    assert single.stops() == ("</tool_call>",) and _auto().stops() == ()
    assert single.visible_text(CALL + CALL, "stop", ()) == CALL
    # a user stop string that comes first still wins; a stop string is only cut on finish_reason stop
    assert single.visible_text("ab STOP" + CALL, "stop", ("STOP",)) == "ab "
    assert _auto().visible_text("ab STOP", "length", ("STOP",)) == "ab STOP"


def test_streamed_content_stops_where_a_call_may_begin():
    use = _auto()
    assert use.content_end("Let me <tool_call>{") == len("Let me ")
    assert use.content_end("Let me <tool_") == len("Let me ")  # a possible start of the tag is held back
    assert use.content_end("Let me <b>") == len("Let me <b>")
    assert ToolUse().content_end("Let me <tool_") == len("Let me <tool_")


def test_template_messages_give_the_arguments_as_objects():
    calls = [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2*3"}'}}]
    out = template_messages([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": calls}])
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"expr": "2*3"}
    assert calls[0]["function"]["arguments"] == '{"expr": "2*3"}'  # the request's messages are not changed


def test_same_reply_compares_arguments_as_json_values():
    ours, _ = _auto().reply(CALL, "stop")
    echo = json.loads(json.dumps(ours))
    assert same_reply(echo, ours) is None
    echo["tool_calls"][0]["function"]["arguments"] = '{"expr":"2*3"}'  # re-serialised by the agent's framework
    assert same_reply(echo, ours) is None
    assert same_reply({**echo, "content": ""}, ours) is None  # null and "" content are the same reply
    echo["tool_calls"][0]["function"]["arguments"] = '{"expr": "2*4"}'
    assert "tool call 0 differs" in same_reply(echo, ours)
    assert "1 tool call(s), the reply had 0" in same_reply(echo, {"role": "assistant", "content": None})
    assert "content differs" in same_reply({"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"})


def test_unknown_parser_names_the_choices():
    assert tool_parser("none") is None and isinstance(tool_parser("hermes"), HermesToolParser)
    with pytest.raises(ConfigError, match="tool_parser: unknown tool-call parser 'qwen9'; allowed: none, hermes"):
        tool_parser("qwen9")
