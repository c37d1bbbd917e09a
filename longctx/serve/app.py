"""The HTTP layer: a FastAPI app exposing the engine with OpenAI's API.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SmolLM2's chat template), ``GET /v1/models``,
``GET /health`` (200 with pool and queue occupancy while the engine loop runs, else 503).

Streaming (``"stream": true``) is Server-Sent Events: one ``data: {chunk}`` per generated token (its text
delta; empty while a multi-byte character or a possible stop string is held back), then a chunk with the
``finish_reason``, then, with ``stream_options.include_usage``, a chunk with ``usage``, then
``data: [DONE]``. ``usage`` counts real tokens: the prompt as tokenized (with the chat template for chat),
and every generated token including the EOS that ended it.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for bad parameters or a
prompt + max_tokens over the context length or the KV pool, 404 for an unknown model or route, 503 when
``max_waiting`` requests already wait for KV blocks (or the engine loop is down). A client that disconnects
(streaming or not) has its request aborted and its KV blocks freed at the next step boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from longctx.kv.block_manager import blocks_for_tokens
from longctx.serve.async_engine import AsyncEngine, Overloaded
from longctx.serve.detok import IncrementalDetokenizer
from longctx.serve.protocol import (
    APIError,
    GenerationRequest,
    chunk,
    error_body,
    full_response,
    new_id,
    parse_request,
    usage_chunk,
)

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_CHAT_MAX_TOKENS = 256  # chat requests without max_tokens: at most this many (and what fits)
DISCONNECT_POLL_S = 0.1


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _ReleasingStream(StreamingResponse):
    """A StreamingResponse that releases (aborts if unfinished) its request however the response ends."""

    def __init__(self, content, aengine: AsyncEngine, handle) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._aengine, self._handle = aengine, handle

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._aengine.release(self._handle)


def create_app(
    aengine: AsyncEngine,
    tokenizer,
    model_name: str = DEFAULT_MODEL_NAME,
    aliases: tuple[str, ...] = ("SmolLM2-135M-Instruct",),
    base_seed: int = 0,
) -> FastAPI:
    """The FastAPI app. The engine loop starts with the app (lifespan) and stops with it."""
    from longctx.serve.sampling import SamplingParams  # torch: only with the real model's executor

    names = {model_name, *aliases}
    seeds = itertools.count(base_seed)
    engine = aengine.engine
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app):
        aengine.start()
        yield
        aengine.stop()

    app = FastAPI(title="longctx serve", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(exc.status_code, msg), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500)

    @app.get("/health")
    async def health():
        body = {"status": "ok" if aengine.healthy else "error", **aengine.stats()}
        if aengine.loop_error:
            body["error"] = aengine.loop_error
        return JSONResponse(body, status_code=200 if aengine.healthy else 503)

    @app.get("/v1/models")
    async def models():
        card = {
            "object": "model",
            "created": created,
            "owned_by": "longctx",
            "max_model_len": engine.max_model_len,
        }
        return {"object": "list", "data": [{"id": model_name, **card}]}

    def tokenize(req: GenerationRequest) -> list[int]:
        if req.kind == "chat":
            return tokenizer.encode_chat(req.messages)
        if isinstance(req.prompt, list):
            vocab = tokenizer.vocab_size
            bad = [t for t in req.prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
            return list(req.prompt)
        return tokenizer.encode(req.prompt)

    def check_lengths(n_prompt: int, max_tokens: int | None) -> int:
        limit = engine.max_model_len
        if max_tokens is None:  # chat without max_tokens: what fits, up to the default
            max_tokens = min(DEFAULT_CHAT_MAX_TOKENS, limit - n_prompt)
        if n_prompt + max(max_tokens, 1) > limit or max_tokens < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion). "
                "Please reduce the length of the prompt or of max_tokens.",
                "max_tokens" if n_prompt < limit else "prompt",
                "context_length_exceeded",
            )
        bm = engine.block_manager
        need = blocks_for_tokens(n_prompt + max_tokens, bm.block_size)
        if need > bm.num_blocks:
            raise APIError(
                400,
                f"the request needs {need} KV cache blocks of {bm.block_size} tokens ({n_prompt} prompt + "
                f"{max_tokens} completion tokens) but this server's pool has {bm.num_blocks} "
                "(start it with a larger --kv-blocks, or shorten the request)",
                "max_tokens",
                "kv_cache_too_small",
            )
        return max_tokens

    async def generate(request: Request, kind: str):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
        req = parse_request(body, kind)
        if req.model not in names:
            raise APIError(
                404,
                f"The model `{req.model}` does not exist; this server has {model_name!r}",
                "model",
                "model_not_found",
            )
        ids = tokenize(req)
        if not ids:
            raise APIError(400, "the prompt is empty after tokenization", "prompt")
        max_tokens = check_lengths(len(ids), req.max_tokens)
        sampling = None
        if req.temperature > 0:
            seed = req.seed if req.seed is not None else next(seeds)
            sampling = SamplingParams(req.temperature, req.top_p, seed)
        try:
            handle = aengine.submit(ids, max_tokens, sampling)
        except Overloaded as exc:
            raise APIError(503, str(exc), code="server_overloaded") from None
        rid = new_id(kind)
        if req.stream:
            return _ReleasingStream(_stream(req, rid, handle, len(ids)), aengine, handle)
        try:
            return await _collect_or_disconnect(request, req, rid, handle, len(ids))
        finally:
            aengine.release(handle)

    async def _events(handle, detok: IncrementalDetokenizer):
        """Yield ``(delta_text, None)`` per token, then ``(tail_text, finish_reason)`` once."""
        while True:
            kind, payload = await handle.events.get()
            if kind == "error":
                raise APIError(500, payload)
            if kind == "finish":
                yield detok.flush(), payload
                return
            for token_id, _time_s in payload:
                delta = detok.add(token_id)
                if detok.stopped:
                    aengine.abort(handle)  # frees its blocks now; the stop string is not returned
                    yield delta, None
                    yield "", "stop"
                    return
                yield delta, None

    async def _stream(req: GenerationRequest, rid: str, handle, n_prompt: int):
        detok = IncrementalDetokenizer(tokenizer, req.stop)
        first, n_out = True, 0
        try:
            async for text, finish in _events(handle, detok):
                if finish is None:
                    n_out += 1
                    yield _sse(chunk(req, rid, text, None, first))
                    first = False
                else:
                    yield _sse(chunk(req, rid, text, finish, first))
            if req.include_usage:
                yield _sse(usage_chunk(req, rid, n_prompt, n_out))
        except APIError as exc:  # headers are sent: report the error in the stream, as OpenAI does
            yield _sse(exc.body())
        yield "data: [DONE]\n\n"

    async def _collect(req: GenerationRequest, rid: str, handle, n_prompt: int):
        detok = IncrementalDetokenizer(tokenizer, req.stop)
        parts, n_out, reason = [], 0, "stop"
        async for text, finish in _events(handle, detok):
            parts.append(text)
            if finish is None:
                n_out += 1
            else:
                reason = finish
        return JSONResponse(full_response(req, rid, "".join(parts), reason, n_prompt, n_out))

    async def _collect_or_disconnect(request: Request, req, rid, handle, n_prompt):
        task = asyncio.ensure_future(_collect(req, rid, handle, n_prompt))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    aengine.abort(handle)
                    return JSONResponse(error_body(400, "client disconnected"), status_code=499)
        finally:
            if not task.done():
                task.cancel()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    return app
