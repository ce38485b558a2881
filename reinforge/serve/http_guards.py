"""What every reinforge HTTP app installs: OpenAI-style error bodies, a request-body size limit, an
optional API key (``Authorization: Bearer``) on every route but ``GET /health``, and that route."""

from __future__ import annotations

import hmac
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from reinforge.serve.schema import APIError

API_KEY_ENV = "REINFORGE_API_KEY"
"""The environment variable an API key is read from when none is given."""


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-style error bodies: our ``APIError``s, request validation (400 naming the field), HTTP
    errors, and anything unexpected (500); the server stays up."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if p != "body") or None
        message = first["msg"].removeprefix("Value error, ")
        return JSONResponse(APIError(400, f"{param}: {message}" if param else message, param).body(), 400)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse(APIError(e.status_code, str(e.detail)).body(), e.status_code)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, e: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"{type(e).__name__}: {e}", type_="server_error").body(), 500)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused with 413 before it is read (by its
    Content-Length), or cut off while it is read (chunked bodies: FastAPI then answers 400). The
    trainer's weight upload (``/reinforge/weights``, a whole model) is exempt."""

    EXEMPT = ("/reinforge/weights",)

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in self.EXEMPT:
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            error = APIError(413, f"body: {length.decode(errors='replace')} bytes; this server takes at most "
                                  f"{self.max_bytes} (max_body_bytes)", param="body", code="request_too_large")
            return await JSONResponse(error.body(), 413)(scope, receive, send)
        seen = 0

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise APIError(413, f"body: over {self.max_bytes} bytes (max_body_bytes)", param="body")
            return message

        await self.app(scope, limited, send)


class ApiKeyGuard:
    """ASGI middleware: every request but ``GET /health`` needs ``Authorization: Bearer <api_key>``
    (compared in constant time); otherwise a 401 with an OpenAI-style body (``code: invalid_api_key``),
    as vLLM's ``--api-key`` does."""

    OPEN = ("/health",)
    HINT = "send the header 'Authorization: Bearer <api key>'"

    def __init__(self, app: Any, api_key: str) -> None:
        if not api_key:
            raise ValueError("api_key must not be empty")
        self.app, self._expected = app, f"Bearer {api_key}".encode()

    def authorised(self, headers: dict[bytes, bytes]) -> bool:
        """The request's headers carry the key (``Authorization: Bearer <key>``), compared in constant time."""
        return hmac.compare_digest(headers.get(b"authorization", b""), self._expected)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or (scope["type"] == "http" and scope.get("path") in self.OPEN):
            return await self.app(scope, receive, send)
        if not self.authorised(dict(scope["headers"])):
            if scope["type"] != "http":  # a websocket: closed with "policy violation"
                return await send({"type": "websocket.close", "code": 1008})
            error = APIError(401, f"missing or wrong API key: {self.HINT}",
                             code="invalid_api_key")
            return await JSONResponse(error.body(), 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        await self.app(scope, receive, send)


def install_guards(app: FastAPI, max_body_bytes: int, api_key: str | None) -> None:
    """The body limit, the API key (when one is given; outermost, so an unauthorised request is
    refused before its body is read) and ``GET /health`` (open, for load balancers and launchers)."""
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if api_key:
        app.add_middleware(ApiKeyGuard, api_key=api_key)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}


def resolve_api_key(given: str | None) -> str | None:
    """``given``, else the ``REINFORGE_API_KEY`` environment variable (as vLLM reads ``VLLM_API_KEY``),
    else None (no key: every route is open)."""
    return given or os.environ.get(API_KEY_ENV) or None
