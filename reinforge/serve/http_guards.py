"""What every reinforge HTTP app installs: OpenAI-style error bodies and a request-body size limit."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from reinforge.serve.schema import APIError


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
