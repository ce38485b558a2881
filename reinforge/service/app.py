"""A Tinker-compatible training service over HTTP (FastAPI): the routes the ``tinker`` client (0.38) calls.

Session: ``/api/v1/client/config``, ``client/dynamic_config``, ``create_session``, ``session_heartbeat``,
``sessions/{id}/finish``, ``telemetry``, ``get_server_capabilities``, ``healthz``. Training:
``create_model``, ``get_info``, ``forward_backward`` (protobuf or JSON; ``forward_only`` for ``forward``),
``forward`` (JSON), ``optim_step``, ``save_weights``, ``load_weights``, ``save_weights_for_sampler``.
Sampling: ``create_sampling_session``, ``join_sampling_session``, ``asample``. Futures:
``retrieve_future`` (long poll), ``cancel_future``.

Guards (``serve/http_guards.py``): the request-body limit and, with an API key, the key on every route
but the health checks, sent as ``X-API-Key: <key>`` (the Tinker client's header) or
``Authorization: Bearer <key>``; 401 otherwise. A body that does not validate is a 422 naming the field
(``{"error": {"message": "<field>: <why>", "param": "<field>", ...}}``).
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from reinforge.errors import ReinforgeError
from reinforge.serve.http_guards import ApiKeyGuard, install_error_handlers, install_guards
from reinforge.serve.schema import APIError
from reinforge.service import jobs, wire
from reinforge.service.core import TrainingService
from reinforge.service.schema import (
    CreateModelRequest,
    CreateSamplingSessionRequest,
    CreateSessionRequest,
    FieldError,
    ForwardBackwardRequest,
    LoadWeightsRequest,
    ModelRequest,
    OptimStepRequest,
    RetrieveFutureRequest,
    SampleRequest,
    SaveForSamplerRequest,
    SaveWeightsRequest,
    SessionRequest,
)

PROTO = "application/x-protobuf"
LONG_POLL_S = 20.0
M = TypeVar("M", bound=BaseModel)


class ServiceKeyGuard(ApiKeyGuard):
    """``ApiKeyGuard`` that also takes the key in ``X-API-Key`` (the Tinker client's header)."""

    OPEN = ("/health", "/api/v1/healthz")
    HINT = "send the header 'X-API-Key: <api key>' (the Tinker client: api_key= or TINKER_API_KEY)"

    def authorised(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"x-api-key", b"")
        return super().authorised(headers) or hmac.compare_digest(b"Bearer " + given, self._expected)


def _fail(e: FieldError) -> JSONResponse:
    return JSONResponse(APIError(e.status, str(e), param=e.field).body(), e.status)


def parse(model: type[M], data: Any) -> M:
    """``data`` as ``model``; ``FieldError`` naming the first field at fault by its path."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise FieldError(field, first["msg"].removeprefix("Value error, ")) from None


def create_app(service: TrainingService, api_key: str | None = None) -> FastAPI:
    """The service's app over ``service``; ``api_key``: required of every request but the health checks."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(title="reinforge Tinker-compatible training service", lifespan=lifespan)
    app.state.service = service
    install_guards(app, service.limits.max_body_bytes, None)
    if api_key:
        app.add_middleware(ServiceKeyGuard, api_key=api_key)
    install_error_handlers(app)
    app.exception_handler(FieldError)(lambda _, e: _fail(e))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        return _fail(FieldError(field, first["msg"]))

    _session_routes(app, service)
    _training_routes(app, service)
    _sampling_routes(app, service)
    _future_routes(app, service)
    return app


async def _json(request: Request) -> dict[str, Any]:
    """The request's JSON body, which must be an object (a 422 naming ``body`` otherwise)."""
    try:
        data = await request.json()
    except ValueError:
        raise FieldError("body", "not valid JSON") from None
    if not isinstance(data, dict):
        raise FieldError("body", f"expected a JSON object, got {type(data).__name__}")
    return data


def _session_routes(app: FastAPI, svc: TrainingService) -> None:
    import uuid

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return {"pjwt_auth_enabled": False, "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False,
                "use_pyqwest_transport": False, "sample_use_retrieve_futures": False,
                "custom_loss_server_side": False, "sample_join_sampling_session": False,
                "fwdbwd_max_chunk_len": svc.limits.max_datums}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        parse(CreateSessionRequest, await _json(request))
        session_id = uuid.uuid4().hex
        svc.sessions.add(session_id)
        return {"type": "create_session", "session_id": session_id}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, str]:
        svc.session(parse(SessionRequest, await _json(request)).session_id)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict[str, str]:
        svc.sessions.discard(session_id)
        return {"status": "finished"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return {"supported_models": [{"model_name": name, "trainable": True, "sampleable": True}
                                     for name in svc.models]}


def _training_routes(app: FastAPI, svc: TrainingService) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return svc.submit(jobs.create_model_job(svc, parse(CreateModelRequest, await _json(request))))

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return svc.info(parse(ModelRequest, await _json(request)).model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if PROTO in request.headers.get("content-type", ""):
            if request.headers.get("content-encoding"):
                raise FieldError("body", "compressed bodies are not accepted (Content-Encoding)", 415)
            data = wire.decode_forward_backward(await request.body())
        else:
            data = await _json(request)
        req = parse(ForwardBackwardRequest, data)
        return svc.submit(jobs.forward_backward_job(svc, req), model_id=req.model_id)

    @app.post("/api/v1/forward")
    async def forward(request: Request) -> dict[str, Any]:
        req = parse(ForwardBackwardRequest, {**(await _json(request)), "forward_only": True})
        return svc.submit(jobs.forward_backward_job(svc, req), model_id=req.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        req = parse(OptimStepRequest, await _json(request))
        return svc.submit(jobs.optim_step_job(svc, req), model_id=req.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        req = parse(SaveWeightsRequest, await _json(request))
        return svc.submit(jobs.save_weights_job(svc, req), model_id=req.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        job, model_id = jobs.load_weights_job(svc, parse(LoadWeightsRequest, await _json(request)))
        return svc.submit(job, model_id=model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        req = parse(SaveForSamplerRequest, await _json(request))
        return svc.submit(jobs.save_for_sampler_job(svc, req), model_id=req.model_id)


def _sampling_routes(app: FastAPI, svc: TrainingService) -> None:
    counters: dict[str, int] = {}

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        req = parse(CreateSamplingSessionRequest, await _json(request))
        svc.session(req.session_id)
        base, key = svc.sampling_target(req.base_model, req.model_path)
        return {"type": "create_sampling_session", "sampling_session_id": svc.new_sampling_session(base, key)}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        """What the client asks after ``create_sampling_client(model_path=...)`` to learn the base model."""
        if sampler_id not in svc.sampling:
            raise FieldError("sampler_id", f"no such sampling session {sampler_id!r}", 404)
        base, key = svc.sampling[sampler_id]
        path = next((p for p, target in svc.snapshot_paths.items() if target == (base, key)), None)
        return {"sampler_id": sampler_id, "base_model": base, "model_path": path}

    @app.post("/api/v1/join_sampling_session")
    async def join(request: Request) -> dict[str, Any]:
        session = (await _json(request)).get("sampling_session_id", "")
        counters[session] = counters.get(session, 0) + 1
        return {"type": "join_sampling_session", "client_counter": counters[session]}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        req = parse(SampleRequest, await _json(request))
        answer = svc.submit(jobs.sample_job(svc, req), sampling=True)
        answer["sample_sequence_ids"] = [f"{answer['request_id']}-{i}" for i in range(req.num_samples)]
        return answer


def _future_routes(app: FastAPI, svc: TrainingService) -> None:
    @app.post("/api/v1/retrieve_future", response_model=None)
    async def retrieve(request: Request) -> Response | dict[str, Any]:
        req = parse(RetrieveFutureRequest, await _json(request))
        future = svc.future(req.request_id)
        await asyncio.wait({asyncio.wrap_future(future)}, timeout=LONG_POLL_S)  # never cancels the job
        if not future.done():
            return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
        error = future.exception()
        if isinstance(error, ReinforgeError):  # the request's fault: a field, a checkpoint that does not fit
            return {"error": str(error), "category": "user"}
        if error is not None:
            return {"error": f"{type(error).__name__}: {error}", "category": "server"}
        result = future.result()
        if result.proto is not None and PROTO in request.headers.get("accept", ""):
            return Response(result.proto(), media_type=PROTO)
        return result.json

    @app.post("/api/v1/cancel_future")
    async def cancel(request: Request) -> dict[str, str]:
        return {"status": "ok"}
