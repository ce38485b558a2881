"""Request bodies of the OpenAI-compatible API (the subset we serve) and its error body.

Unknown fields are ignored, as OpenAI-compatible servers do; fields we know but cannot honour
(penalties, ``echo``, ``best_of`` > n, ``logit_bias``) are rejected with a 400 naming the field
rather than silently ignored. Extensions (not in OpenAI's API): ``return_token_ids`` returns the
prompt and completion token ids of every choice; a completion ``prompt`` may be token ids (as in
OpenAI's API), and a chat request may give ``prompt_token_ids`` instead of ``messages``, so a
multi-turn trainer never re-tokenises (token-in/token-out).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_TOP_LOGPROBS = 20
TOOL_CHOICES = ("none", "auto", "required")


class APIError(Exception):
    """An error returned to the client as an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ServeLimits(BaseModel):
    """Per-request and load limits of ``reinforge serve`` (and the agent proxy's server): a request
    over one is refused with a status and a message naming the limit, never queued without bound."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(8 << 20, ge=1024, description="largest request body (413 above)")
    max_prompts: int = Field(64, ge=1, description="prompts in one /v1/completions request (400 above)")
    max_sequences: int = Field(512, ge=1, description="n x prompts of one request: the sequences it asks to "
                               "generate (400 above)")
    max_pending: int = Field(256, ge=1, description="requests being served at once; more get 503 (retry later)")
    max_images: int = Field(8, ge=0, description="pictures (image_url parts) in one chat request (400 above)")


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="extension (vLLM, SGLang): 0 = off")
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    return_token_ids: bool = False

    @model_validator(mode="after")
    def _unsupported(self) -> _Sampling:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported by this server (must be 0)")
        if self.logit_bias:
            raise ValueError("logit_bias: not supported by this server")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 stop sequences")
        return self

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(s == "" for s in stops):
            raise APIError(400, "stop: stop sequences must not be empty", param="stop")
        return stops

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo: not supported by this server")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of: not supported by this server (omit it or set it equal to n)")
        if self.suffix:
            raise ValueError("suffix: not supported by this server")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt: must not be empty")
        return self


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"not valid JSON ({e})") from None
        if not isinstance(parsed, dict):
            raise ValueError("must be a JSON object (a string such as '{\"expr\": \"2*3\"}')")
        return value


class ToolCallItem(BaseModel):
    """One entry of an assistant message's ``tool_calls``."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _known_parts(self) -> ChatMessage:
        for i, part in enumerate(self.content if isinstance(self.content, list) else []):
            if part.get("type") == "image_url":
                value = part.get("image_url")
                url = value.get("url") if isinstance(value, dict) else value
                if not isinstance(url, str) or not url:
                    raise ValueError(f"content.{i}.image_url.url: an image part is {{\"type\": \"image_url\", "
                                     "\"image_url\": {\"url\": \"data:image/png;base64,...\"}}")
            elif part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"content.{i}: only text parts ({{\"type\": \"text\", \"text\": ...}}) and image "
                                 f"parts ({{\"type\": \"image_url\", ...}}) are supported, got type {part.get('type')!r}")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError(f"tool_calls: only assistant messages carry tool calls, not {self.role!r} messages")
        return self


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64)


class ToolSpec(BaseModel):
    """One entry of ``tools``: ``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionTool


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionTool


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolSpec] | None = None
    tool_choice: str | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> ChatCompletionRequest:
        if (self.messages is None) == (self.prompt_token_ids is None):
            raise ValueError("give exactly one of messages or prompt_token_ids")
        if self.messages is not None and not self.messages:
            raise ValueError("messages: must not be empty")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs=true")
        self._check_tool_choice()
        self._check_tool_answers()
        return self

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _choice(cls, value: Any) -> Any:
        if value is None or value in TOOL_CHOICES or isinstance(value, dict):
            return value
        raise ValueError(f"must be one of {', '.join(TOOL_CHOICES)} or "
                         f'{{"type": "function", "function": {{"name": ...}}}}, got {value!r}')

    def _check_tool_choice(self) -> None:
        names = [t.function.name for t in self.tools or []]
        choice = self.tool_choice
        if choice in ("required",) or isinstance(choice, NamedToolChoice):
            if not names:
                raise ValueError("tool_choice: a tool must be called, but the request has no tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice: function {choice.function.name!r} is not among the tools ({', '.join(names)})")

    def _check_tool_answers(self) -> None:
        """A ``tool`` message's ``tool_call_id`` must answer a call of an earlier assistant message."""
        called: set[str] = set()
        for i, m in enumerate(self.messages or []):
            called.update(c.id for c in m.tool_calls or [])
            if m.role == "tool" and m.tool_call_id is not None and m.tool_call_id not in called:
                raise ValueError(f"messages.{i}.tool_call_id: {m.tool_call_id!r} answers no tool call of an earlier "
                                 "assistant message")

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """``tools`` as plain dicts (every field the client sent), for the chat template."""
        return [t.model_dump() for t in self.tools] if self.tools else None

    def tool_choice_value(self) -> str | dict[str, Any] | None:
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedToolChoice) else c
