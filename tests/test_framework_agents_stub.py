"""The framework example agents (examples/agents: OpenAI Agents SDK, LangChain) against a scripted
stub OpenAI server: rewards, the exact requests each framework sends (tool list, the echoed
assistant message with its tool_calls, the tool message's tool_call_id), malformed replies, and
that nothing leaves base_url."""

from __future__ import annotations

import importlib
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

from stub_openai_server import StubOpenAI, completion, text_reply, tool_call_reply  # noqa: E402

from reinforge.orchestrate.agent_episodes import BackgroundServer  # noqa: E402
from reinforge.serve import agent_auth  # noqa: E402
from reinforge.types import Task  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "agents"
FRAMEWORKS = {"openai_agents_calculator": "agents", "langchain_calculator": "langchain_openai"}
TASK = Task(id="t0", prompt="482*37=", answer="17834")
ARGS = json.dumps({"expr": "482*37"})  # '{"expr": "482*37"}': tiny-agent's own spelling


class Plans:
    """Per-episode scripted replies for one shared stub server."""

    def __init__(self) -> None:
        self.replies: dict[str, list[dict[str, Any]]] = {}
        self._n = 0
        self._lock = threading.Lock()

    def new(self, *replies: dict[str, Any]) -> str:
        with self._lock:
            self._n += 1
            episode = f"ep{self._n}"
        self.replies[episode] = list(replies)
        return episode

    def __call__(self, episode: str, body: dict[str, Any], k: int) -> dict[str, Any]:
        replies = self.replies[episode]
        if k < len(replies):
            return replies[k]
        return {"_status": 500, "error": {"message": "stub: nothing scripted", "type": "server_error", "param": None,
                                          "code": None}}


@pytest.fixture(scope="module")
def server():
    plans = Plans()
    stub = StubOpenAI(plans)
    with BackgroundServer(stub.app) as url:
        yield stub, plans, url


@pytest.fixture(params=list(FRAMEWORKS))
def agent_module(request, monkeypatch):
    pytest.importorskip(FRAMEWORKS[request.param], reason=f"{FRAMEWORKS[request.param]} is not installed")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    return importlib.import_module(request.param)


def _play(server, module, *replies, task: Task = TASK) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    """(returned reward, the chat request bodies, the posted reward bodies) of one episode."""
    stub, plans, url = server
    episode = plans.new(*replies)
    base_url = f"{url}/episodes/{episode}/v1"
    agent_auth.register(base_url, agent_auth.Credentials(episode, "stub-token"))  # as run_agent_episodes does
    try:
        reward = module.agent(base_url, task)
    finally:
        agent_auth.forget([base_url])
    return reward, stub.requests.get(episode, []), stub.rewards.get(episode, [])


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in body["tools"]]


@pytest.mark.parametrize(("answer", "reward"), [("17834", 1.0), ("The answer is 17834.", 1.0), ("17843", 0.0)])
def test_tool_call_then_answer(server, agent_module, answer, reward):
    got, requests, posted = _play(server, agent_module, tool_call_reply("482*37", call_id="call_x1"),
                                  text_reply(answer))
    assert got == reward and posted == [{"reward": reward, "info": {"correct": reward == 1.0}}]
    assert all(tokens == ["stub-token"] for tokens in server[0].reward_tokens.values())  # sent by the helper
    first, second = requests
    # turn 1: the task's prompt only (no system message: the Agents SDK sends none without instructions)
    assert first["messages"] == [{"role": "user", "content": "482*37="}]
    assert _tool_names(first) == ["calc"] and first["tools"] == second["tools"]
    assert first["tools"][0]["type"] == "function"
    assert first["tools"][0]["function"]["parameters"]["required"] == ["expr"]
    assert not first.get("stream") and not second.get("stream")
    assert "tool_choice" not in first and "parallel_tool_calls" not in first
    # turn 2: the history, the assistant reply echoed with its tool_calls, the tool result
    assert second["messages"][:1] == first["messages"]
    assistant, tool = second["messages"][1:]
    assert assistant["role"] == "assistant" and assistant["content"] is None
    assert assistant["tool_calls"] == [{"id": "call_x1", "type": "function",
                                        "function": {"name": "calc", "arguments": ARGS}}]
    assert tool == {"role": "tool", "tool_call_id": "call_x1", "content": "17834"}  # no "name"


def test_exact_request_fields(server, agent_module):
    """Top-level fields: the SDK sends only model/messages/tools; LangChain adds "stream": false."""
    _, requests, _ = _play(server, agent_module, tool_call_reply("482*37"), text_reply("17834"))
    extra = {"stream"} if agent_module.__name__ == "langchain_calculator" else set()
    assert all(set(body) == {"model", "messages", "tools"} | extra for body in requests)
    assert all(body["model"] == "policy" for body in requests)
    if extra:
        assert all(body["stream"] is False for body in requests)
    tool = requests[0]["tools"][0]["function"]
    if agent_module.__name__ == "openai_agents_calculator":  # strict schema, pydantic titles
        assert tool["strict"] is True and tool["parameters"]["additionalProperties"] is False
        assert tool["parameters"]["title"] == "calc_args"
    else:
        assert "strict" not in tool and set(tool["parameters"]) == {"type", "properties", "required"}


@pytest.mark.parametrize("arguments", ['{"expr":"482*37"}', '{ "expr" : "482*37" }'])
def test_arguments_echo(server, agent_module, arguments):
    """The SDK echoes the arguments string byte for byte; LangChain re-serialises the parsed
    arguments with json.dumps (", " and ": " separators, key order kept, ensure_ascii=False)."""
    _, requests, _ = _play(server, agent_module, tool_call_reply("", arguments=arguments), text_reply("17834"))
    echoed = requests[1]["messages"][1]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(echoed) == {"expr": "482*37"}
    assert echoed == (arguments if agent_module.__name__ == "openai_agents_calculator" else ARGS)


@pytest.mark.parametrize("content", ["", "Let me compute."])
def test_content_next_to_tool_calls(server, agent_module, content):
    """Text next to the tool calls is echoed; an empty string comes back as null (both frameworks)."""
    _, requests, _ = _play(server, agent_module, tool_call_reply("482*37", content=content), text_reply("17834"))
    assert requests[1]["messages"][1]["content"] == (content or None)


def test_two_tool_calls_in_one_reply(server, agent_module):
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": "calc", "arguments": json.dumps({"expr": e})}}
             for i, e in enumerate(["482*37", "2+3"])]
    reward, requests, _ = _play(server, agent_module, completion({"role": "assistant", "content": None,
                                                                  "tool_calls": calls}, "tool_calls"),
                                text_reply("17834"))
    assert reward == 1.0
    assert requests[1]["messages"][1]["tool_calls"] == calls
    assert [(m["tool_call_id"], m["content"]) for m in requests[1]["messages"][2:]] == [("call_0", "17834"),
                                                                                        ("call_1", "5")]


def test_bad_arguments_are_an_error_result(server, agent_module):
    """A bad expression or arguments that are not JSON: an ``error: ...`` tool result, and the episode goes on."""
    reward, requests, _ = _play(server, agent_module, tool_call_reply("482/37", call_id="c1"),
                                tool_call_reply("", call_id="c2", arguments='{"expr": "482*37"'), text_reply("17834"))
    assert reward == 1.0 and len(requests) == 3
    results = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["c1", "c2"]
    assert all(m["content"].startswith("error: ") for m in results)
    assert "/" in results[0]["content"]
    assert requests[2]["messages"][3]["tool_calls"][0]["function"]["arguments"] == '{"expr": "482*37"'  # raw, both


@pytest.mark.parametrize("arguments", ["[1]", '"482*37"'])
def test_arguments_not_an_object(server, agent_module, arguments):
    """JSON arguments that are no object: the SDK answers with an error result and goes on; LangChain
    cannot build its AIMessage (pydantic ValidationError), which the agent scores 0."""
    reward, requests, posted = _play(server, agent_module, tool_call_reply("", arguments=arguments),
                                     text_reply("17834"))
    if agent_module.__name__ == "openai_agents_calculator":
        assert reward == 1.0 and requests[1]["messages"][-1]["content"].startswith("error: ")
    else:
        assert reward == 0.0 and len(requests) == 1
    assert posted == [{"reward": reward, "info": {"correct": reward == 1.0}}]


@pytest.mark.parametrize("reply", [
    text_reply('<tool_call>{"name": "calc", "arguments": {"expr": "17834"}</tool_call>'),  # malformed call text
    text_reply('<tool_call>{"name": "calc", "arguments": {"expr": "482*37"}}</tool_call>'),  # unparsed call text
    text_reply("}}{{ garbage"),
    text_reply(""),
    text_reply("", finish_reason="length"),  # the SDK: ModelBehaviorError (an empty reply cut by max_tokens)
    completion({"role": "assistant", "content": None}, "stop"),
    {"_status": 400, "error": {"message": "too long", "type": "invalid_request_error", "param": "max_tokens",
                               "code": "context_length_exceeded"}},
], ids=["malformed-call", "unparsed-call", "garbage", "empty", "empty-length", "null-content", "context-overflow"])
def test_malformed_replies_score_zero(server, agent_module, reply):
    reward, requests, posted = _play(server, agent_module, reply)
    assert reward == 0.0 and len(requests) == 1 and posted == [{"reward": 0.0, "info": {"correct": False}}]


def test_turn_limit_scores_zero(server, agent_module):
    reward, requests, posted = _play(server, agent_module, *[tool_call_reply("482*37", call_id=f"c{i}") for i in range(8)])
    assert reward == 0.0 and len(requests) == agent_module.MAX_TURNS == 4
    assert posted == [{"reward": 0.0, "info": {"correct": False}}]


def test_server_error_raises(server, agent_module):
    import openai

    with pytest.raises(openai.InternalServerError):
        _play(server, agent_module, {"_status": 500, "error": {"message": "boom", "type": "server_error",
                                                                "param": None, "code": None}})


def test_task_prompt_as_messages(server, agent_module):
    task = Task(id="t1", prompt=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "12*3="}],
                answer="36")
    reward, requests, _ = _play(server, agent_module, tool_call_reply("12*3"), text_reply("36"), task=task)
    assert reward == 1.0 and requests[0]["messages"] == task.prompt


def test_concurrent_episodes_from_a_thread_pool(server, agent_module):
    """As run_agent_episodes calls agents: many at once from worker threads (own event loops for the SDK)."""
    tasks = [Task(id=f"t{i}", prompt=f"{100 + i}*{10 + i}=", answer=str((100 + i) * (10 + i))) for i in range(24)]

    def one(i: int) -> float:
        answer = tasks[i].answer if i % 3 else "0"
        return _play(server, agent_module, tool_call_reply(f"{100 + i}*{10 + i}"), text_reply(answer), task=tasks[i])[0]

    with ThreadPoolExecutor(16) as pool:
        rewards = list(pool.map(one, range(24)))
    assert rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(24)]


_CONNECTIONS: list[tuple[str, Any]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _CONNECTIONS is not None and event in ("socket.connect", "socket.getaddrinfo"):
        _CONNECTIONS.append((event, args[1] if event == "socket.connect" else args[:2]))


def test_no_traffic_but_base_url(server, agent_module, monkeypatch):
    """Every connection (and name lookup) during an episode goes to base_url's host and port, even
    with LangSmith tracing asked for in the environment and an OpenAI key there (with both, the
    frameworks' defaults export traces to api.smith.langchain.com / api.openai.com)."""
    global _CONNECTIONS
    monkeypatch.setenv("LANGSMITH_TRACING", "true")
    monkeypatch.setenv("LANGCHAIN_TRACING_V2", "true")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-a-key")
    if hasattr(agent_module, "_HTTP"):  # a fresh pool: the episode's connection is made (and seen) here
        import httpx

        monkeypatch.setattr(agent_module, "_HTTP", httpx.Client())
    if not getattr(sys, "_reinforge_stub_audit", False):
        sys.addaudithook(_audit)
        sys._reinforge_stub_audit = True
    _CONNECTIONS = []
    try:
        reward, _, _ = _play(server, agent_module, tool_call_reply("482*37"), text_reply("17834"))
        if agent_module.__name__ == "openai_agents_calculator":
            from agents.tracing import get_trace_provider

            get_trace_provider().force_flush()  # the SDK's exporter would post its traces now
        import time

        time.sleep(0.5)  # LangSmith's background thread would have connected by now
        seen = list(_CONNECTIONS)
    finally:
        _CONNECTIONS = None
    port = int(server[2].rsplit(":", 1)[1])
    assert reward == 1.0 and seen
    for event, target in seen:
        host, p = target[0], target[1]
        assert host == "127.0.0.1" and int(p) == port, (event, target)
