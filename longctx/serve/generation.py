"""From a validated request to its answer: tokenize, check it fits, submit it, stream or collect its text.

``Generation`` is what both endpoints run (``longctx.serve.app`` only routes to it):

    ids = tokenize(req)                    # chat template for chat, token ids as given, else the tokenizer
    max_tokens = check_fits(len(ids), req) # context length (OpenAI's message) and the KV pool (admission)
    handle = aengine.submit(ids, max_tokens, sampling)
    stream(...) | collect_or_disconnect(...)

A stop string ends the request at once (aborted: its blocks are freed). A client that goes away has its
request aborted at the next step boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from longctx.engine.admission import PoolTooSmall, check_fits_pool
from longctx.engine.sampling_params import SamplingParams
from longctx.serve.async_engine import AsyncEngine, Overloaded, RequestHandle
from longctx.serve.detok import IncrementalDetokenizer
from longctx.serve.protocol import (
    APIError,
    GenerationRequest,
    chunk,
    error_body,
    full_response,
    new_id,
    usage_chunk,
)

DEFAULT_CHAT_MAX_TOKENS = 256  # chat requests without max_tokens: at most this many (and what fits)
DISCONNECT_POLL_S = 0.1


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _ReleasingStream(StreamingResponse):
    """A StreamingResponse that releases (aborts if unfinished) its request however the response ends."""

    def __init__(self, content, aengine: AsyncEngine, handle: RequestHandle) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._aengine, self._handle = aengine, handle

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._aengine.release(self._handle)


class Generation:
    """Runs requests on ``aengine`` with ``tokenizer``; unseeded sampled requests get seeds from ``base_seed``."""

    def __init__(self, aengine: AsyncEngine, tokenizer, base_seed: int = 0) -> None:
        self.aengine, self.tokenizer = aengine, tokenizer
        self._seeds = itertools.count(base_seed)

    # ---- before the engine ----
    def tokenize(self, req: GenerationRequest) -> list[int]:
        if req.kind == "chat":
            ids = self.tokenizer.encode_chat(req.conversation)
        elif isinstance(req.prompt, list):
            vocab = self.tokenizer.vocab_size
            bad = [t for t in req.prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
            ids = list(req.prompt)
        else:
            ids = self.tokenizer.encode(req.prompt)
        if not ids:
            raise APIError(400, "the prompt is empty after tokenization", "prompt")
        return ids

    def check_fits(self, n_prompt: int, req: GenerationRequest) -> int:
        """The request's ``max_tokens`` once it fits the context length, the executor (a press's window) and
        the KV pool (else a 400)."""
        engine = self.aengine.engine
        limit, max_tokens = engine.max_model_len, req.requested_max_tokens
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
        try:
            engine.executor.check_prompt(n_prompt)  # e.g. a KV press whose window is longer than the prompt
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt", "invalid_value") from None
        try:
            check_fits_pool(engine.block_manager, n_prompt, max_tokens)
        except PoolTooSmall as exc:
            hint = " (start the server with a larger --kv-blocks, or shorten the request)"
            raise APIError(400, f"{exc}{hint}", "max_tokens", "kv_cache_too_small") from None
        return max_tokens

    def sampling(self, req: GenerationRequest) -> SamplingParams | None:
        if req.sampling_temperature == 0:
            return None  # greedy
        seed = req.seed if req.seed is not None else next(self._seeds)
        return SamplingParams(req.sampling_temperature, req.sampling_top_p, seed)

    async def respond(self, request: Request, req: GenerationRequest):
        """The HTTP response to a validated request: an SSE stream, or one JSON body."""
        ids = self.tokenize(req)
        max_tokens = self.check_fits(len(ids), req)
        try:
            handle = self.aengine.submit(ids, max_tokens, self.sampling(req))
        except Overloaded as exc:
            raise APIError(503, str(exc), code="server_overloaded") from None
        rid = new_id(req.kind)
        if req.stream:
            return _ReleasingStream(self._stream(req, rid, handle, len(ids)), self.aengine, handle)
        try:
            return await self._collect_or_disconnect(request, req, rid, handle, len(ids))
        finally:
            self.aengine.release(handle)

    # ---- while the engine runs it ----
    async def _events(self, handle: RequestHandle, detok: IncrementalDetokenizer):
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
                    self.aengine.abort(handle)  # frees its blocks now; the stop string is not returned
                    yield delta, None
                    yield "", "stop"
                    return
                yield delta, None

    async def _stream(self, req: GenerationRequest, rid: str, handle: RequestHandle, n_prompt: int):
        detok = IncrementalDetokenizer(self.tokenizer, req.stop_sequences)
        first, n_out = True, 0
        try:
            async for text, finish in self._events(handle, detok):
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

    async def _collect(self, req: GenerationRequest, rid: str, handle: RequestHandle, n_prompt: int):
        detok = IncrementalDetokenizer(self.tokenizer, req.stop_sequences)
        parts, n_out, reason = [], 0, "stop"
        async for text, finish in self._events(handle, detok):
            parts.append(text)
            if finish is None:
                n_out += 1
            else:
                reason = finish
        return JSONResponse(full_response(req, rid, "".join(parts), reason, n_prompt, n_out))

    async def _collect_or_disconnect(self, request: Request, req, rid, handle, n_prompt):
        task = asyncio.ensure_future(self._collect(req, rid, handle, n_prompt))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    self.aengine.abort(handle)
                    return JSONResponse(error_body(400, "client disconnected"), status_code=499)
        finally:
            if not task.done():
                task.cancel()
