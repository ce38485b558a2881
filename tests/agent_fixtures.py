"""Black-box agents for tests: plain functions written against the official ``openai`` client,
the way a user's agent code is (loaded by name: ``env.agent: agent_fixtures:arithmetic_agent``)."""

from __future__ import annotations

from openai import OpenAI

from reinforge.serve.agent_auth import post_reward
from reinforge.types import Task


def arithmetic_agent(base_url: str, task: Task) -> None:
    """One chat call for the task's prompt; posts reward 1 (and correct) when the reply is the answer."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=task.prompt)
    ok = reply.choices[0].message.content.strip() == task.answer
    post_reward(base_url, float(ok), info={"correct": ok})


def returning_agent(base_url: str, task: Task) -> float:
    """The same, reporting the reward by returning it."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="policy", messages=task.prompt)
    return float(reply.choices[0].message.content.strip() == task.answer)
