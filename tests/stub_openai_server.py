"""A scripted OpenAI-compatible chat-completions server for testing agent code written with agent
frameworks (OpenAI Agents SDK, LangChain) without a model: it records every request body and
answers each call of an episode with the next scripted reply.

Routes mirror the agent proxy's (``reinforge/serve/proxy.py``): ``POST /episodes/<id>/v1/chat/completions``
and ``POST /episodes/<id>/reward``; any other request is recorded under ``other`` and gets a 404.

    stub = StubOpenAI(lambda episode, body, k: [tool_call_reply("482*37"), text_reply("17834")][k])
    with BackgroundServer(stub.app) as url:
        reward = agent(f"{url}/episodes/e1/v1", task)
    stub.requests["e1"]  # the JSON bodies of e1's chat calls, in order
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

Script = Callable[[str, dict[str, Any], int], dict[str, Any]]
"""``script(episode_id, request_body, call_index)`` -> the response body (a dict), or one with a
``"_status"`` key to answer with that HTTP status instead of 200."""


def completion(message: dict[str, Any], finish_reason: str, *, extras: bool = True,
               drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A chat.completion body with one choice; ``extras`` adds the proxy's extension fields
    (``choices[0].prompt_token_ids`` / ``token_ids``, top-level ``reinforge``); ``drop`` removes
    top-level keys (to find which ones a client needs)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
    body: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                            "created": int(time.time()), "model": "policy", "choices": [choice],
                            "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}
    if extras:
        choice["prompt_token_ids"], choice["token_ids"] = [1, 2, 3], [4, 5, 2]
        body["reinforge"] = {"episode_id": "stub", "segment": 0, "call": 0, "policy_version": 0}
    for key in drop:
        body.pop(key, None)
    return body


def tool_call_reply(expr: str, call_id: str = "call_0", content: str | None = None,
                    arguments: str | None = None, **kw: Any) -> dict[str, Any]:
    """An assistant reply calling ``calc(expr)`` (``arguments``: the raw JSON string to send instead)."""
    args = arguments if arguments is not None else json.dumps({"expr": expr})
    message = {"role": "assistant", "content": content,
               "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "calc", "arguments": args}}]}
    return completion(message, "tool_calls", **kw)


def text_reply(text: str, finish_reason: str = "stop", **kw: Any) -> dict[str, Any]:
    """A plain text assistant reply."""
    return completion({"role": "assistant", "content": text}, finish_reason, **kw)


def scripted(*replies: dict[str, Any]) -> Script:
    """The same replies, in order, for every episode (a call past the end gets a 500)."""
    def script(episode_id: str, body: dict[str, Any], k: int) -> dict[str, Any]:
        if k < len(replies):
            return replies[k]
        return {"_status": 500, "error": {"message": f"stub: no reply scripted for call {k}", "type": "server_error",
                                          "param": None, "code": None}}
    return script


def answered_by(reply: Callable[[str, str], str]) -> Script:
    """A script whose reply text is ``reply(episode_id, content of the request's last message)``: e.g. a
    judge's verdict computed from the completions it was shown."""
    def script(episode_id: str, body: dict[str, Any], k: int) -> dict[str, Any]:
        return text_reply(reply(episode_id, body["messages"][-1]["content"]), extras=False)
    return script


class StubOpenAI:
    """The app (``.app``) and what it recorded: ``requests[episode]`` (chat request bodies, in
    order), ``rewards[episode]`` (the reward bodies), ``reward_tokens[episode]`` (their reward-token headers), ``headers[episode]`` (the chat calls' headers)
    and ``other`` (method, path of any other request)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: dict[str, list[dict[str, Any]]] = {}
        self.headers: dict[str, list[dict[str, str]]] = {}
        self.rewards: dict[str, list[dict[str, Any]]] = {}
        self.reward_tokens: dict[str, list[str | None]] = {}
        self.other: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        app = FastAPI()

        @app.post("/episodes/{episode_id}/v1/chat/completions")
        async def chat(episode_id: str, request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                calls = self.requests.setdefault(episode_id, [])
                calls.append(body)
                self.headers.setdefault(episode_id, []).append(dict(request.headers))
                k = len(calls) - 1
            reply = dict(self.script(episode_id, body, k))
            return JSONResponse(reply, status_code=reply.pop("_status", 200))

        @app.post("/episodes/{episode_id}/reward")
        async def reward(episode_id: str, request: Request) -> JSONResponse:
            body = await request.json()
            with self._lock:
                self.rewards.setdefault(episode_id, []).append(body)
                self.reward_tokens.setdefault(episode_id, []).append(request.headers.get("x-reinforge-reward-token"))
            return JSONResponse({"episode_id": episode_id, "reward": body.get("reward"), "done": True})

        @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
        async def anything(path: str, request: Request) -> JSONResponse:
            with self._lock:
                self.other.append((request.method, "/" + path))
            return JSONResponse({"error": {"message": f"stub: no route /{path}", "type": "invalid_request_error",
                                           "param": None, "code": None}}, status_code=404)

        self.app = app
