"""The agent proxy's HTTP app and request checks (reinforge/serve/proxy.py holds the episodes)."""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Header
from pydantic import BaseModel, ConfigDict, Field

from reinforge.errors import ReinforgeError
from reinforge.rollout.chat_splice import Message
from reinforge.serve.agent_auth import REWARD_TOKEN_HEADER
from reinforge.serve.http_guards import install_error_handlers, install_guards
from reinforge.serve.schema import APIError, ChatCompletionRequest, ChatMessage, ServeLimits

Scalar = int | float | str | bool


class EpisodeError(ReinforgeError):
    """An episode is unknown, has no reward, or still has a call in flight."""


class RewardBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reward: float = Field(allow_inf_nan=False)
    done: bool = True
    info: dict[str, Scalar] | None = None



def _check_request(req: ChatCompletionRequest) -> None:
    if req.n != 1:
        raise APIError(400, f"n: the agent proxy generates one choice per call (got n={req.n}); make n calls",
                       param="n")
    if req.stream:
        raise APIError(400, "stream: the agent proxy does not stream; set stream=false", param="stream")
    if req.messages is None:
        raise APIError(400, "prompt_token_ids: not supported by the agent proxy; send messages", param="messages")
    if req.chat_template_kwargs:
        raise APIError(400, "chat_template_kwargs: not supported by the agent proxy", param="chat_template_kwargs")


def _message(m: ChatMessage) -> Message:
    """A request message as a plain dict; text content parts are joined into one string (with image parts, the
    parts stay: the processor renders them, serve/vision_chat.py)."""
    out = m.model_dump(exclude_none=True)
    if isinstance(m.content, list) and all(part.get("type") == "text" for part in m.content):
        out["content"] = "".join(part["text"] for part in m.content)
    return out


def _follows(messages: list[Message], tip: list[Message]) -> bool:
    """``messages`` = ``tip``'s earlier messages exactly, then an assistant turn in the place of the
    reply (``same_reply`` checks it is the reply), then at least one new message."""
    return bool(tip) and len(messages) > len(tip) and messages[: len(tip) - 1] == tip[:-1]


def _build_app(proxy: Any) -> FastAPI:
    """The routes of an ``AgentProxy`` (reinforge/serve/proxy.py): models, chat completions, reward
    (its token checked before the body is read), health; the API key when the proxy has one."""
    app = FastAPI(title="reinforge agent proxy")
    app.state.proxy = proxy
    install_guards(app, ServeLimits().max_body_bytes, proxy.api_key)
    install_error_handlers(app)

    def reward_allowed(episode_id: str, token: str | None = Header(None, alias=REWARD_TOKEN_HEADER)) -> None:
        proxy.authorize_reward(episode_id, token)

    @app.get("/episodes/{episode_id}/v1/models")
    async def models(episode_id: str) -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": proxy.model_name, "object": "model", "created": proxy.created, "owned_by": "reinforge"}]}

    @app.post("/episodes/{episode_id}/v1/chat/completions")
    async def chat(episode_id: str, req: ChatCompletionRequest) -> dict[str, Any]:
        return await proxy.chat(episode_id, req)

    @app.post("/episodes/{episode_id}/reward", dependencies=[Depends(reward_allowed)])
    async def reward(episode_id: str, body: RewardBody) -> dict[str, Any]:
        try:
            status = proxy.set_reward(episode_id, body.reward, body.done, body.info)
        except EpisodeError as e:
            raise APIError(404, str(e), code="episode_not_found") from None
        return {"episode_id": episode_id, "reward": status.reward, "done": status.done, "calls": status.calls}

    return app
