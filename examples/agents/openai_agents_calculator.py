"""The calculator task played by an OpenAI Agents SDK agent (``pip install openai-agents``) through
reinforge's agent proxy: an ``Agent`` with a ``calc`` function tool on ``OpenAIChatCompletionsModel``.

Train it (the shipped tiny-agent and the calculator task of the ``agent_calculator`` recipe; the
agent replaces the built-in environment; naming it drops the recipe's environment options)::

    PYTHONPATH=examples/agents reinforge train agent_calculator env.name=agent \\
        env.agent=openai_agents_calculator:agent env.agent_workers=16

``agent(base_url, task)`` plays one episode: the task's prompt as the input, no instructions (the
SDK then sends no system message; the chat template renders the tool list, ``tools: calc``, in a
system block of its own: what tiny-agent was trained on), at most ``MAX_TURNS`` model calls. The
reward is 1.0 when the final answer's last integer is ``task.answer`` (and the answer is not a
leftover ``<tool_call>`` block), else 0.0; it is posted to the proxy with ``info.correct`` (for the
``reward/accuracy`` metric) and returned.

Model misbehaviour ends the episode with reward 0 and never raises: too many turns
(``MaxTurnsExceeded``), a reply the SDK rejects (``ModelBehaviorError``, e.g. an empty reply cut
by ``max_tokens``) or a context overflow (the proxy's 400 ``context_length_exceeded``). Any other
error of the proxy (an HTTP error, a refused connection) propagates: the batch fails loudly.
Bad tool arguments become an ``error: ...`` tool result, as in the built-in environment.

Threads: the training loop calls ``agent`` from a thread pool (``env.agent_workers`` at once).
Each call runs its own event loop (``asyncio.run``) with its own ``AsyncOpenAI`` client, closed
at the end; nothing async is shared between calls.

Network: tracing is disabled globally (``set_tracing_disabled``) and per run, so the SDK never
exports traces to api.openai.com; the model is given as an object with its own client, so the
SDK's default OpenAI provider (and ``OPENAI_API_KEY``/``OPENAI_BASE_URL``) is never used. The
only connections are to ``base_url``.
"""

from __future__ import annotations

import asyncio

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, BadRequestError

from reinforge.envs.calculator import evaluate, last_integer
from reinforge.envs.tools import ToolError
from reinforge.serve.agent_auth import api_key, post_reward

MAX_TURNS = 4
"""Model calls per episode (tiny-agent needs 2: the tool call, then the answer)."""

set_tracing_disabled(True)


def _tool_error(ctx, error: Exception) -> str:
    """Arguments the SDK cannot read or validate: an ``error: ...`` result the model sees (the SDK's
    default is a fixed text without the reason)."""
    return f"error: {str(error).splitlines()[0]}"


@function_tool(failure_error_function=_tool_error)
def calc(expr: str) -> str:
    """Evaluate integer arithmetic with + - * and parentheses.

    Args:
        expr: The expression, e.g. 482*37
    """
    try:
        return str(evaluate(expr))
    except ToolError as e:
        return f"error: {e}"


def score(text: str | None, answer: str) -> bool:
    """The final answer is right: its last integer is the answer, and it is not a (malformed) tool call."""
    text = text or ""
    return "<tool_call>" not in text and last_integer(text) == int(answer)


async def play(base_url: str, prompt) -> str | None:
    """One episode; the final answer's text, or None when the model misbehaved."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key(base_url), max_retries=0) as client:
        agent = Agent(name="calculator", instructions=None, tools=[calc],
                      model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
        try:
            result = await Runner.run(agent, prompt, max_turns=MAX_TURNS,
                                      run_config=RunConfig(tracing_disabled=True, trace_include_sensitive_data=False))
        except (MaxTurnsExceeded, ModelBehaviorError):
            return None
        except BadRequestError as e:
            if e.code == "context_length_exceeded":
                return None
            raise
    return result.final_output if isinstance(result.final_output, str) else None


def agent(base_url: str, task) -> float:
    """Play ``task`` against the OpenAI-compatible ``base_url``; post and return the reward."""
    prompt = task.prompt if isinstance(task.prompt, str) else [dict(m) for m in task.prompt]
    ok = score(asyncio.run(play(base_url, prompt)), task.answer)
    reward = float(ok)
    post_reward(base_url, reward, info={"correct": ok})  # with the episode's reward token
    return reward
