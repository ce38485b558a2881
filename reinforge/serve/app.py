"""An OpenAI-compatible HTTP server over the rollout engine (FastAPI).

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``n``, ``stop``, ``max_tokens``, ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``seed``,
``logprobs``, streaming), plus ``GET /reinforge/info`` and ``POST /reinforge/weights`` (new weights
as a safetensors body, ``?version=N``) for a trainer that drives rollouts through this server, and
``GET /health`` (the one route open without the API key, when the server has one).

Stop sequences end the completion and are not part of the returned text (OpenAI semantics); the
``token_ids`` extension returns every sampled token, so they include the stop sequence's tokens.
Log-probabilities are those of the sampling distribution softmax(z / T) before top-p/top-k.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from reinforge.rollout.engines import context_limit
from reinforge.rollout.types import Generation, SamplingParams
from reinforge.serve.http_guards import install_error_handlers, install_guards
from reinforge.serve.schema import APIError, ChatCompletionRequest, CompletionRequest, ServeLimits, _Sampling
from reinforge.serve.tool_calls import ToolUse, template_messages, tool_parser
from reinforge.serve.vision_chat import check_image_root, image_part_fields, vision_chat_prompt
from reinforge.serve.worker import EngineWorker, Job, TokenEvent

DEFAULT_COMPLETION_TOKENS = 16


def create_app(engine: Any, model_name: str, max_batch_sequences: int = 256,
               limits: ServeLimits | None = None, tool_parser_name: str | None = "hermes",
               parameter_names: list[str] | None = None, api_key: str | None = None,
               image_root: str | Path | None = None) -> FastAPI:
    """The server app over a rollout engine (any registered one); ``tool_parser_name`` reads tool calls
    out of chat replies (``reinforge/serve/tool_calls.py``; None or ``"none"``: replies are plain
    text); ``parameter_names``: what ``/reinforge/weights`` must receive (default: the engine's model's);
    ``api_key``: every route but ``GET /health`` then needs ``Authorization: Bearer <api_key>`` (401);
    ``image_root``: chat image parts may name files inside it (else data URLs only, serve/vision_chat.py)."""
    limits = limits or ServeLimits()
    names = parameter_names if parameter_names is not None else [n for n, _ in engine.model.named_parameters()]
    server = _Server(engine, model_name, max_batch_sequences, limits, tool_parser(tool_parser_name))
    server.image_root = check_image_root(image_root)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        server.worker.close()

    app = FastAPI(title="reinforge OpenAI-compatible server", lifespan=lifespan)
    app.state.server = server
    install_guards(app, limits.max_body_bytes, api_key)
    install_error_handlers(app)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": model_name, "object": "model", "created": server.created, "owned_by": "reinforge"}
        ]}

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest) -> Any:
        return await server.admitted(server.completions, req)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest) -> Any:
        return await server.admitted(server.chat, req)

    @app.get("/reinforge/info")
    async def info() -> dict[str, Any]:
        return {"model": model_name, "policy_version": engine.version, "batches_run": server.worker.batches_run,
                "max_position_embeddings": server.max_positions, "pending_requests": server.pending,
                "limits": limits.model_dump()}

    @app.post("/reinforge/weights")
    async def weights(request: Request, version: int) -> dict[str, Any]:
        from safetensors.torch import load

        try:
            state = load(await request.body())
        except Exception as e:
            raise APIError(400, f"body: not a safetensors payload ({e})", param="body") from None
        missing = [n for n in names if n not in state]
        if missing:
            raise APIError(400, f"body: missing parameters, e.g. {missing[:3]}", param="body")
        await asyncio.wrap_future(server.worker.update_weights(state, version))
        return {"policy_version": version}

    return app


class _Server:
    def __init__(self, engine: Any, model_name: str, max_batch_sequences: int,
                 limits: ServeLimits, parser: Any = None) -> None:
        self.engine, self.model_name, self.tokenizer = engine, model_name, engine.tokenizer
        self.parser = parser
        self.worker = EngineWorker(engine, max_batch_sequences)
        self.created = int(time.time())
        self.max_positions = int(context_limit(engine) or 1 << 30)
        self.limits, self.pending = limits, 0
        self.image_root: Path | None = None

    async def admitted(self, handler: Any, req: _Sampling) -> Any:
        """``handler(req)`` unless ``limits.max_pending`` requests are already being served (503); a
        streamed reply counts until its stream ends (or its client goes away)."""
        if self.pending >= self.limits.max_pending:
            raise APIError(503, f"server busy: {self.pending} requests in progress (max_pending); retry later",
                           code="server_busy", type_="server_busy")
        self.pending += 1
        try:
            reply = await handler(req)
        except BaseException:
            self.pending -= 1
            raise
        if isinstance(reply, StreamingResponse):
            reply.background = BackgroundTask(self._release)  # runs once the stream ended or broke off
        else:
            self.pending -= 1
        return reply

    def _release(self) -> None:
        self.pending -= 1

    # ------------------------------------------------------------------ requests -> jobs
    def _params(self, req: _Sampling, prompts: list[list[int]], default_tokens: int | None,
                extra_stops: tuple[str, ...] = ()) -> SamplingParams:
        if req.model != self.model_name:
            raise APIError(404, f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")
        if len(prompts) > self.limits.max_prompts:
            raise APIError(400, f"prompt: {len(prompts)} prompts; at most {self.limits.max_prompts} per request "
                                "(max_prompts)", param="prompt")
        if len(prompts) * req.n > self.limits.max_sequences:
            raise APIError(400, f"n: {req.n} x {len(prompts)} prompts = {req.n * len(prompts)} sequences; at most "
                                f"{self.limits.max_sequences} per request (max_sequences)", param="n")
        longest = max(len(p) for p in prompts)
        room = self.max_positions - longest
        max_tokens = req.max_completion_tokens or req.max_tokens or default_tokens or room
        if room < 1 or longest + max_tokens > self.max_positions:
            raise APIError(400, f"max_tokens: the prompt ({longest} tokens) plus max_tokens ({max_tokens}) exceeds "
                                f"the model's context of {self.max_positions} tokens", param="max_tokens")
        vocab = len(self.tokenizer)
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise APIError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
        return SamplingParams(
            max_new_tokens=max_tokens, temperature=req.temperature or 1.0, top_p=req.top_p, top_k=req.top_k,
            n=req.n, greedy=req.temperature == 0, stop=req.stop_list() + extra_stops,
        )

    def _completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if not all(isinstance(x, int) for x in p) and len(p) > self.limits.max_prompts:  # before tokenising them
            raise APIError(400, f"prompt: {len(p)} prompts; at most {self.limits.max_prompts} per request "
                                "(max_prompts)", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # one prompt given as token ids
        prompts = []
        for x in p:
            ids = list(x) if isinstance(x, list) else list(self.tokenizer(x, add_special_tokens=True)["input_ids"])
            if not ids:
                raise APIError(400, "prompt: a prompt must have at least one token", param="prompt")
            prompts.append(ids)
        return prompts

    def _chat_prompt(self, req: ChatCompletionRequest, use: ToolUse) -> tuple[list[int], dict[str, Any]]:
        """The prompt's token ids: the rendered messages, then the text a tool_choice forces; and its model
        inputs (the pictures of its image parts, serve/vision_chat.py; {} for text)."""
        if req.prompt_token_ids is not None:
            if not req.prompt_token_ids:
                raise APIError(400, "prompt_token_ids: must not be empty", param="prompt_token_ids")
            return (list(req.prompt_token_ids)
                    + list(self.tokenizer(use.prefix, add_special_tokens=False)["input_ids"])), {}
        messages = template_messages([m.model_dump(exclude_none=True) for m in req.messages or []])
        if image_part_fields(messages):
            return vision_chat_prompt(getattr(self.engine, "processor", None), messages, req.tool_schemas(),
                                      req.chat_template_kwargs or {}, use.prefix, self.limits.max_images,
                                      self.image_root)
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "messages: this model's tokenizer has no chat template; use /v1/completions",
                           param="messages")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=req.tool_schemas(), tokenize=False, add_generation_prompt=True,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as e:
            raise APIError(400, f"messages: the chat template failed: {e}", param="messages") from None
        return list(self.tokenizer(text + use.prefix, add_special_tokens=False)["input_ids"]), {}

    def _checked(self, job: Job, stream: bool | None) -> Job:
        """``job``, unless it needs single decode steps (streaming, top log-probs) from an engine that
        does not report them (``reports_steps = False``, e.g. vLLM): 400."""
        if (stream or job.top_logprobs) and not getattr(self.engine, "reports_steps", True):
            raise APIError(400, f"{'stream' if stream else 'logprobs'}: this server's rollout engine does not report "
                           "single decode steps (streaming, top log-probs); serve with --engine torch for them",
                           param="stream" if stream else "logprobs")
        return job

    # ------------------------------------------------------------------ endpoints
    async def completions(self, req: CompletionRequest) -> Any:
        prompts = self._completion_prompts(req)
        params = self._params(req, prompts, DEFAULT_COMPLETION_TOKENS)
        job = self._checked(Job(prompts, params, req.seed, top_logprobs=req.logprobs or 0), req.stream)
        meta = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self.model_name}
        if req.stream:
            return _sse(self._stream(job, req, meta, chat=False))
        gens, tops = await asyncio.wrap_future(self.worker.submit(job))
        choices = []
        for i, (g, top) in enumerate(zip(gens, tops, strict=True)):
            text = _strip_stop(g.text, params.stop) if g.finish_reason == "stop" else g.text
            choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": g.finish_reason,
                                      "logprobs": self._completion_logprobs(g, top) if req.logprobs is not None else None}
            if req.return_token_ids:
                choice.update(prompt_token_ids=g.prompt_ids, token_ids=g.token_ids)
            choices.append(choice)
        return {**meta, "object": "text_completion", "choices": choices, "usage": _usage(prompts, gens)}

    async def chat(self, req: ChatCompletionRequest) -> Any:
        use = ToolUse.of(req.tool_schemas(), req.tool_choice_value(), req.parallel_tool_calls, self.parser)
        prompt, inputs = self._chat_prompt(req, use)
        params = self._params(req, [prompt], None, use.stops())
        job = self._checked(Job([prompt], params, req.seed, top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
                                model_inputs=[inputs]), req.stream)
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self.model_name}
        if req.stream:
            return _sse(self._stream(job, req, meta, chat=True, use=use))
        gens, tops = await asyncio.wrap_future(self.worker.submit(job))
        choices = []
        for i, (g, top) in enumerate(zip(gens, tops, strict=True)):
            message, finish = use.reply(use.visible_text(g.text, g.finish_reason, req.stop_list()), g.finish_reason)
            choice: dict[str, Any] = {
                "index": i, "message": message, "finish_reason": finish,
                "logprobs": {"content": self._chat_logprobs(g.token_ids, g.logprobs, top)} if req.logprobs else None,
            }
            if req.return_token_ids:
                choice.update(prompt_token_ids=g.prompt_ids, token_ids=g.token_ids)
            choices.append(choice)
        return {**meta, "object": "chat.completion", "choices": choices, "usage": _usage([prompt], gens)}

    # ------------------------------------------------------------------ streaming
    async def _stream(self, job: Job, req: _Sampling, meta: dict[str, Any], chat: bool,
                      use: ToolUse | None = None) -> AsyncIterator[dict]:
        """Content as it is generated (held back where a stop string or a tool-call block may be
        starting); a chat reply's tool calls come at the end as ``delta.tool_calls``, one chunk each."""
        use = use or ToolUse()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job.on_token = lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev)
        future = asyncio.wrap_future(self.worker.submit(job))
        future.add_done_callback(lambda _: events.put_nowait(None))
        rows = job.rows
        tokens: list[list[int]] = [[] for _ in range(rows)]
        pending: list[list[TokenEvent]] = [[] for _ in range(rows)]
        emitted = [0] * rows
        hold = max((len(s) for s in job.params.stop), default=1) - 1
        obj = "chat.completion.chunk" if chat else "text_completion"
        want_logprobs = bool(getattr(req, "logprobs", None) is not None and getattr(req, "logprobs", None) is not False)
        if chat:
            for r in range(rows):
                yield {**meta, "object": obj, "choices": [
                    {"index": r, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        while (ev := await events.get()) is not None:
            row = ev[0]
            tokens[row].append(ev[1])
            pending[row].append(ev)
            text = use.prefix + self.tokenizer.decode(tokens[row], skip_special_tokens=True)
            safe = min(len(text) - hold, use.content_end(text))
            if use.parser is not None and not text[:safe].strip():
                safe = 0  # whitespace before a call is not content
            if safe > emitted[row]:
                yield self._chunk(meta, obj, row, text[emitted[row]:safe], None, pending[row], want_logprobs, chat)
                emitted[row], pending[row] = safe, []
        try:
            gens, _ = future.result()
        except Exception as e:
            yield APIError(500, f"{type(e).__name__}: {e}", type_="server_error").body()
            return
        for row, g in enumerate(gens):
            message, finish = use.reply(use.visible_text(g.text, g.finish_reason, req.stop_list()), g.finish_reason)
            calls = message.get("tool_calls") or []
            rest = (message["content"] or "")[emitted[row]:]
            if rest or not calls or (want_logprobs and pending[row]):
                yield self._chunk(meta, obj, row, rest, None if calls else finish, pending[row], want_logprobs, chat)
            for k, call in enumerate(calls):
                yield {**meta, "object": obj, "choices": [
                    {"index": row, "delta": {"tool_calls": [{"index": k, **call}]}, "logprobs": None, "finish_reason": None}]}
            if calls:
                yield {**meta, "object": obj, "choices": [{"index": row, "delta": {}, "logprobs": None, "finish_reason": finish}]}
        if req.include_usage:
            yield {**meta, "object": obj, "choices": [], "usage": _usage(job.prompts, gens)}

    def _chunk(self, meta: dict, obj: str, row: int, text: str, finish: str | None, events: list[TokenEvent],
               want_logprobs: bool, chat: bool) -> dict[str, Any]:
        logprobs = None
        if want_logprobs:
            ids, lps, tops = [e[1] for e in events], [e[2] for e in events], [e[3] for e in events]
            if chat:
                logprobs = {"content": self._chat_logprobs(ids, lps, tops)}
            else:
                logprobs = self._completion_logprobs_raw(ids, lps, tops)
        if chat:
            return {**meta, "object": obj, "choices": [
                {"index": row, "delta": {"content": text} if text else {}, "logprobs": logprobs,
                 "finish_reason": finish}]}
        return {**meta, "object": obj, "choices": [
            {"index": row, "text": text, "logprobs": logprobs, "finish_reason": finish}]}

    # ------------------------------------------------------------------ log-probs
    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _completion_logprobs(self, g: Generation, top: list) -> dict[str, Any]:
        return self._completion_logprobs_raw(g.token_ids, g.logprobs, top)

    def _completion_logprobs_raw(self, ids: list[int], lps: list[float], top: list) -> dict[str, Any]:
        texts = [self._token_text(t) for t in ids]
        offsets, pos = [], 0
        for t in texts:
            offsets.append(pos)
            pos += len(t)
        top_dicts = [{self._token_text(a): lp for a, lp in alts} for alts in top] if top else [{} for _ in ids]
        return {"tokens": texts, "token_logprobs": lps, "top_logprobs": top_dicts, "text_offset": offsets}

    def _chat_logprobs(self, ids: list[int], lps: list[float], top: list) -> list[dict[str, Any]]:
        out = []
        for i, (t, lp) in enumerate(zip(ids, lps, strict=True)):
            s = self._token_text(t)
            alts = top[i] if i < len(top) else []
            out.append({"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": [
                {"token": self._token_text(a), "logprob": alp, "bytes": list(self._token_text(a).encode())}
                for a, alp in alts]})
        return out


def _strip_stop(text: str, stops: tuple[str, ...]) -> str:
    """The completion up to (not including) the first stop sequence."""
    cut = min((i for s in stops if (i := text.find(s)) >= 0), default=len(text))
    return text[:cut]


def _usage(prompts: list[list[int]], gens: list[Generation]) -> dict[str, int]:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")
