"""OpenAI function calling through `reinforge serve` with the shipped tiny-agent model, driven by the
official `openai` client: tool_calls replies (plain and streamed), tool messages, tool_choice,
parallel_tool_calls, malformed calls and bad requests."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the serve extra (openai) is not installed")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")

from reinforge.envs.calculator import calculator_toolbox  # noqa: E402
from reinforge.orchestrate.agent_episodes import BackgroundServer  # noqa: E402
from reinforge.serve.launch import build_server_app  # noqa: E402

MODEL = "tiny-agent"
TOOLS = calculator_toolbox().schemas
ASK = [{"role": "user", "content": "482*37="}]
GREEDY = {"model": MODEL, "tools": TOOLS, "temperature": 0, "max_tokens": 64}


@pytest.fixture(scope="module")
def server():
    app = build_server_app(MODEL, seed=0)
    with BackgroundServer(app, log_level="error") as url:
        yield app, url


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=f"{server[1]}/v1", api_key="none", max_retries=0)


def _tokenizer(server):
    return server[0].state.server.tokenizer


def test_a_tool_call_comes_back_as_tool_calls(server, client):
    r = client.chat.completions.create(messages=ASK, extra_body={"return_token_ids": True}, **GREEDY)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calc" and json.loads(call.function.arguments) == {"expr": "482*37"}
    # the reply is read from exactly the tokens the model generated
    generated = _tokenizer(server).decode(choice.model_extra["token_ids"], skip_special_tokens=True)
    assert generated == '<tool_call>{"name": "calc", "arguments": {"expr": "482*37"}}</tool_call>'


def test_streamed_tool_calls_assemble_in_the_official_client(client):
    plain = client.chat.completions.create(messages=ASK, **GREEDY).choices[0]
    with client.chat.completions.stream(messages=ASK, **GREEDY) as stream:
        chunks = list(stream)
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and not final.message.content
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in plain.message.tool_calls]
    assert any(getattr(e, "type", "") == "tool_calls.function.arguments.done" for e in chunks)


def test_sampled_replies_with_n(client):
    r = client.chat.completions.create(messages=ASK, model=MODEL, tools=TOOLS, n=8, seed=1, max_tokens=64)
    for choice in r.choices:  # every choice is a call or plain content, never both missing
        assert (choice.finish_reason == "tool_calls") == bool(choice.message.tool_calls)
        assert choice.message.tool_calls or choice.message.content
    assert sum(bool(c.message.tool_calls) for c in r.choices) >= 4


def test_the_next_request_renders_the_call_and_the_tool_result_as_the_model_was_trained(server, client):
    first = client.chat.completions.create(messages=ASK, **GREEDY).choices[0].message
    messages = [*ASK, first.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "17834"}]
    r = client.chat.completions.create(messages=messages, extra_body={"return_token_ids": True}, **GREEDY)
    expected = ('<bos><|system|>tools: calc<|user|>482*37=<|assistant|><tool_call>{"name": "calc", "arguments": '
                '{"expr": "482*37"}}</tool_call><eos><|tool|>17834<|assistant|>')
    assert _tokenizer(server).decode(r.choices[0].model_extra["prompt_token_ids"]) == expected
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content.isdigit()  # the final answer


def test_tool_choice_none_required_and_named(server, client):
    tok = _tokenizer(server)
    none = client.chat.completions.create(messages=ASK, tool_choice="none", **GREEDY).choices[0]
    assert none.message.tool_calls is None and none.finish_reason == "stop"
    assert none.message.content.startswith("<tool_call>")  # the model's text, not parsed
    named = {"type": "function", "function": {"name": "calc"}}
    for choice, forced in (("required", "<tool_call>"), (named, '<tool_call>{"name": "calc", "arguments": ')):
        r = client.chat.completions.create(messages=[{"role": "user", "content": "123*45="}], tool_choice=choice,
                                           extra_body={"return_token_ids": True}, **GREEDY).choices[0]
        assert tok.decode(r.model_extra["prompt_token_ids"]).endswith("<|assistant|>" + forced)
        assert r.finish_reason == "tool_calls" and r.message.tool_calls[0].function.name == "calc"
        assert json.loads(r.message.tool_calls[0].function.arguments) == {"expr": "123*45"}


def test_parallel_tool_calls_false_ends_the_turn_after_the_first_call(server, client):
    r = client.chat.completions.create(messages=ASK, parallel_tool_calls=False, extra_body={"return_token_ids": True},
                                       **GREEDY).choices[0]
    tok = _tokenizer(server)
    assert r.finish_reason == "tool_calls" and len(r.message.tool_calls) == 1
    assert tok.decode(r.model_extra["token_ids"][-1:]) == "</tool_call>"  # stopped there, before <eos>


def test_a_malformed_call_is_content_not_a_500(client):
    # greedy tiny-agent writes a broken call for an addition it never saw with tools (invalid JSON)
    r = client.chat.completions.create(messages=[{"role": "user", "content": "48+37="}], **GREEDY).choices[0]
    assert r.message.tool_calls is None and r.finish_reason == "stop"
    assert r.message.content.startswith("<tool_call>")
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.message.content.removeprefix("<tool_call>").removesuffix("</tool_call>"))


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server[1]}/v1/chat/completions", json={"model": MODEL, "max_tokens": 8, **body}, timeout=30)


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": ASK, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": ASK, "tool_choice": "required"}, "tool_choice"),
    ({"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "search"}}}, "tool_choice"),
    ({"messages": ASK, "tools": TOOLS, "parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
    ({"messages": ASK, "tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"messages": ASK, "tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{bad"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "calc", "arguments": '"2*3"'}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "calc", "arguments": "{}"}}]}]}, "messages.1.tool_calls.0.id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_nowhere", "content": "1"}]}, "messages.1.tool_call_id"),
])
def test_bad_tool_requests_get_a_400_naming_the_field(server, body, param):
    r = _post(server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert param in error["message"] and (error["param"] in (None, param) or param.startswith(error["param"]))
    assert _post(server, {"messages": ASK}).status_code == 200  # the server keeps answering


def test_the_tool_parser_is_chosen_by_name():
    from fastapi.testclient import TestClient

    from reinforge.errors import ConfigError

    with pytest.raises(ConfigError, match="tool_parser: unknown tool-call parser 'qwen9'; allowed: none, hermes"):
        build_server_app(MODEL, tool_parser="qwen9")
    with TestClient(build_server_app(MODEL, tool_parser="none")) as plain:  # replies are never parsed
        r = plain.post("/v1/chat/completions", json={"messages": ASK, **GREEDY}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["message"]["content"].startswith("<tool_call>")
    assert "tool_calls" not in r["message"]
