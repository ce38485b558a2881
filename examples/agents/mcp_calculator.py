"""The calculator task played through reinforge's agent proxy by a plain OpenAI-client agent whose tools
come from an MCP server (reinforge/envs/mcp_tools.py): the server's tools are sent as ``tools``, and each
``tool_calls`` entry of a reply is executed on the server, with `MCPToolbox`'s timeouts, concurrency
bound and error results.

The server is named by environment variables: ``MCP_SERVER`` (a stdio command line, e.g.
``python my_calculator_server.py``) or ``MCP_SERVER_URL`` (a streamable-HTTP endpoint), and optionally
``MCP_TOOLS`` (comma-separated: only these of its tools; tiny-agent was trained on ``tools: calc``)::

    MCP_SERVER="python my_server.py" MCP_TOOLS=calc PYTHONPATH=examples/agents \\
        reinforge train agent_calculator env.name=agent env.agent=mcp_calculator:agent

One connection to the server per process, shared by the episodes (``env.agent_workers`` threads)
and closed at exit. ``agent(base_url, task)`` plays one episode of at most ``MAX_TURNS`` model
calls and posts and returns the reward: 1.0 when the final answer's last integer is
``task.answer``. A server that dies mid-episode is an ``error: ...`` tool result the model sees
(the episode goes on); the next call reconnects (`MCPServerConfig.max_reconnects`).
"""

from __future__ import annotations

import json
import os
import shlex
from functools import cache

from openai import BadRequestError, OpenAI

from reinforge.envs.calculator import last_integer
from reinforge.envs.mcp_tools import MCPToolbox, mcp_toolbox
from reinforge.envs.tools import MalformedToolCall, ToolCall
from reinforge.serve.agent_auth import api_key, post_reward

MAX_TURNS = 4


@cache
def toolbox() -> MCPToolbox:
    """The MCP server's toolbox, from ``MCP_SERVER`` / ``MCP_SERVER_URL`` and ``MCP_TOOLS``."""
    tools = os.environ.get("MCP_TOOLS")
    chosen = {"tools": tuple(t.strip() for t in tools.split(",") if t.strip())} if tools else {}
    if os.environ.get("MCP_SERVER_URL"):
        return mcp_toolbox({"url": os.environ["MCP_SERVER_URL"], **chosen})
    command = shlex.split(os.environ.get("MCP_SERVER", ""))
    if not command:
        raise RuntimeError("set MCP_SERVER (a stdio server's command line) or MCP_SERVER_URL")
    return mcp_toolbox({"command": command[0], "args": tuple(command[1:]), **chosen})


def _call(tool_call) -> ToolCall | MalformedToolCall:
    try:
        arguments = json.loads(tool_call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        return MalformedToolCall(tool_call.function.arguments, f"invalid JSON: {e}")
    if not isinstance(arguments, dict):
        return MalformedToolCall(tool_call.function.arguments, "arguments must be a JSON object")
    return ToolCall(tool_call.function.name, arguments)


def play(base_url: str, messages: list[dict]) -> str | None:
    """One episode; the final answer's text, or None (too many turns, or the context overflowed)."""
    box = toolbox()
    with OpenAI(base_url=base_url, api_key=api_key(base_url), max_retries=0) as client:
        for _ in range(MAX_TURNS):
            try:
                reply = client.chat.completions.create(model="policy", messages=messages, tools=box.schemas)
            except BadRequestError as e:
                if e.code == "context_length_exceeded":
                    return None
                raise
            message = reply.choices[0].message
            if not message.tool_calls:
                return message.content
            messages.append(message.model_dump(exclude_none=True))
            for tool_call in message.tool_calls:
                result = box.call(_call(tool_call))
                messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": result.content})
    return None


def agent(base_url: str, task) -> float:
    """Play ``task`` against the OpenAI-compatible ``base_url``; post and return the reward."""
    prompt = [{"role": "user", "content": task.prompt}] if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
    text = play(base_url, prompt)
    ok = text is not None and "<tool_call>" not in text and last_integer(text) == int(task.answer)
    post_reward(base_url, float(ok), info={"correct": ok})
    return float(ok)
