"""The calculator task played by a LangChain tool-calling loop (``pip install langchain-openai``)
through reinforge's agent proxy: ``ChatOpenAI(...).bind_tools([calc])``, invoked by hand.

Train it (the shipped tiny-agent and the calculator task of the ``agent_calculator`` recipe; the
agent replaces the built-in environment; naming it drops the recipe's environment options)::

    PYTHONPATH=examples/agents reinforge train agent_calculator env.name=agent \\
        env.agent=langchain_calculator:agent env.agent_workers=16

``agent(base_url, task)`` plays one episode: the task's prompt as the messages (no system message:
the chat template renders the tool list, ``tools: calc``, in a system block of its own), then up
to ``MAX_TURNS`` model calls: each reply's ``tool_calls`` run and come back as ``ToolMessage``\\ s
with their ``tool_call_id``; the first reply without a tool call is the final answer. The reward
is 1.0 when its last integer is ``task.answer`` (and it is not a leftover ``<tool_call>`` block),
else 0.0; it is posted to the proxy with ``info.correct`` (for the ``reward/accuracy`` metric)
and returned.

Model misbehaviour ends the episode with reward 0 and never raises: no final answer within
``MAX_TURNS`` calls, tool-call arguments that are JSON but not an object (LangChain fails to
build the reply's ``AIMessage``) or a context overflow (the proxy's 400 ``context_length_exceeded``). Any other error of the proxy
propagates: the batch fails loudly. Bad tool arguments, an unknown tool and arguments that are not
JSON (LangChain's ``invalid_tool_calls``) become an ``error: ...`` tool result, as in the built-in
environment.

Threads: ``agent`` is called from a thread pool; every call builds its own ``ChatOpenAI`` over
one shared ``httpx.Client`` (thread-safe; it pools the connections to the proxy across episodes,
where LangChain's default would cache one client per base URL, i.e. per episode).

Network: nothing leaves ``base_url``. LangSmith tracing is switched off for the calls whatever
the environment says (``langsmith.tracing_context(enabled=False)`` overrides ``LANGSMITH_TRACING``
/ ``LANGCHAIN_TRACING_V2``); tiktoken (which downloads its encodings) is only used to count tokens
(``get_num_tokens*``), which this loop never calls.
"""

from __future__ import annotations

import httpx
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage, convert_to_messages
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langsmith import tracing_context
from openai import BadRequestError
from pydantic import ValidationError

from reinforge.envs.calculator import evaluate, last_integer
from reinforge.envs.tools import ToolError
from reinforge.serve.agent_auth import api_key, reward_headers, reward_url

MAX_TURNS = 4
"""Model calls per episode (tiny-agent needs 2: the tool call, then the answer)."""

# connect timeout 60 s: the proxy runs in the trainer's process, which can be slow to accept on a loaded machine
_HTTP = httpx.Client(timeout=httpx.Timeout(600.0, connect=60.0), limits=httpx.Limits(max_connections=256))


@tool(parse_docstring=True)
def calc(expr: str) -> str:
    """Evaluate integer arithmetic with + - * and parentheses.

    Args:
        expr: The expression, e.g. 482*37
    """
    try:
        return str(evaluate(expr))
    except ToolError as e:
        return f"error: {e}"


def run_tool(call: dict) -> str:
    """A tool call's result; unknown tools and bad arguments are ``error: ...`` results."""
    if call["name"] != calc.name:
        return f"error: unknown tool {call['name']!r}; available: {calc.name}"
    expr = call["args"].get("expr")
    if set(call["args"]) != {"expr"} or not isinstance(expr, str):
        return f"error: bad arguments for {calc.name}: {call['args']!r} (expected {{'expr': string}})"
    return calc.invoke({"expr": expr})


def score(text: str, answer: str) -> bool:
    """The final answer is right: its last integer is the answer, and it is not a (malformed) tool call."""
    return "<tool_call>" not in text and last_integer(text) == int(answer)


def play(base_url: str, messages: list[BaseMessage]) -> str | None:
    """One episode; the final answer's text, or None when the model misbehaved."""
    llm = ChatOpenAI(base_url=base_url, api_key=api_key(base_url), model="policy", max_retries=0,
                     http_client=_HTTP).bind_tools([calc])
    for _ in range(MAX_TURNS):
        try:
            reply: AIMessage = llm.invoke(messages)
        except BadRequestError as e:
            if e.code == "context_length_exceeded":
                return None
            raise
        except ValidationError:  # LangChain cannot build the AIMessage: tool-call arguments that are JSON but no object
            return None
        if not reply.tool_calls and not reply.invalid_tool_calls:
            return reply.text
        messages.append(reply)  # echoed with its tool_calls, the invalid ones included (their raw arguments)
        messages += [ToolMessage(content=run_tool(call), tool_call_id=call["id"]) for call in reply.tool_calls]
        messages += [ToolMessage(content="error: malformed tool call: the arguments are not a JSON object",
                                 tool_call_id=call["id"]) for call in reply.invalid_tool_calls]
    return None


def agent(base_url: str, task) -> float:
    """Play ``task`` against the OpenAI-compatible ``base_url``; post and return the reward."""
    with tracing_context(enabled=False):
        text = play(base_url, convert_to_messages(
            [("user", task.prompt)] if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]))
    ok = text is not None and score(text, task.answer)
    reward = float(ok)
    _HTTP.post(reward_url(base_url), json={"reward": reward, "info": {"correct": ok}}, headers=reward_headers(base_url),
               timeout=60).raise_for_status()
    return reward
