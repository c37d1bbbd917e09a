"""From a validated request to its answer: tokenize, check it fits, submit its sequences, stream or collect.

``Generation`` is what both endpoints run (``longctx.serve.app`` only routes to it):

    prompts = await tokenize(req)                 # chat template for chat; a batch of prompts for
                                                  # completions; refused untokenized if provably too long
    max_tokens = check_fits(len(ids), req)        # per prompt: context length (OpenAI's message), the KV pool
    handles = [aengine.submit(ids, max_tokens, sampling(req, j), ignore_eos) for each prompt, for j < n]
    stream(...) | collect(...)                    # one ``ChoiceRun`` per sequence (``longctx.serve.choices``)

``n`` sequences of one prompt are submitted together: with prefix caching on, the later ones take the first
one's full prompt blocks in the same step (``longctx.engine.batch``), so the prompt is computed once. A stop
string or stop token ends a sequence at once (aborted: its blocks are freed). A client that goes away has
every sequence of its request aborted at the next step boundary.
"""

from __future__ import annotations

import asyncio
import itertools
import json

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from longctx.engine.admission import PoolTooSmall, check_fits_pool
from longctx.engine.sampling_params import SamplingParams
from longctx.serve.async_engine import AsyncEngine, Overloaded
from longctx.serve.chat import ChatRenderer
from longctx.serve.choices import ChoiceRun
from longctx.serve.limits import ContextLimits
from longctx.serve.protocol import APIError, GenerationRequest, error_body
from longctx.serve.responses import LogprobFormatter, chunk, full_response, new_id, usage

DISCONNECT_POLL_S = 0.1


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


class _ReleasingStream(StreamingResponse):
    """A StreamingResponse that releases (aborts if unfinished) its sequences however the response ends."""

    def __init__(self, content, aengine: AsyncEngine, runs: list[ChoiceRun]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._aengine, self._runs = aengine, runs

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for run in self._runs:
                self._aengine.release(run.handle)


class Generation:
    """Runs requests on ``aengine`` with ``tokenizer``; unseeded sampled requests get seeds from
    ``base_seed``."""

    def __init__(self, aengine: AsyncEngine, tokenizer, base_seed: int = 0, model_name: str = "",
                 limits: ContextLimits | None = None, chat: ChatRenderer | None = None) -> None:
        self.aengine, self.tokenizer, self.model_name = aengine, tokenizer, model_name
        self.limits = limits or ContextLimits(tokenizer, aengine.engine.max_model_len)
        self.chat = chat or ChatRenderer(tokenizer)
        self.formatter = LogprobFormatter(tokenizer)
        self._seeds = itertools.count(base_seed)

    # ---- before the engine ----
    def token_ids(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """A prompt's token ids (token ids are checked against the vocabulary). A completion's text gets the
        model's BOS first where it wants one (Gemma); a rendered chat does not (its template writes what it
        needs: vLLM tokenizes chats with ``add_special_tokens=False``)."""
        if isinstance(prompt, list):
            vocab = self.tokenizer.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "prompt")
            return list(prompt)
        ids = self.tokenizer.encode(prompt) if chat else self.tokenizer.prompt_ids(prompt)
        if not ids:
            raise APIError(400, "the prompt is empty after tokenization", "prompt")
        return ids

    def prompt_texts(self, req: GenerationRequest) -> list[tuple[str | None, str | list[int]]]:
        """``(text as sent or None, what to tokenize: a text, or token ids)`` per prompt (chat: the rendered
        conversation, one prompt)."""
        if req.kind == "chat":
            text = self.chat.render(req.conversation, req.add_generation_prompt, req.continue_final_message,
                                    req.chat_template, req.chat_template_kwargs)
            return [(None, text)]
        return [(p if isinstance(p, str) else None, p) for p in req.prompts]

    def prepare(self, req: GenerationRequest) -> list[tuple[str | None, list[int]]]:
        """``(text or None, token ids)`` per prompt. A text whose length alone proves it is over the context
        is refused untokenized (``longctx.serve.limits``)."""
        prompts = self.prompt_texts(req)
        least = max(1, req.requested_max_tokens or 1)
        for _, p in prompts:
            if isinstance(p, str):
                try:
                    least_prompt = self.limits.min_tokens(p)
                except UnicodeEncodeError as exc:
                    field = "messages" if req.kind == "chat" else "prompt"
                    raise APIError(400, f"'{field}' is not valid Unicode: a lone surrogate "
                                   f"({p[exc.start]!r}) has no UTF-8 form", field, "invalid_value") from None
                self.refuse_over_context(least_prompt, least, req, at_least=True)
        return [(text, self.token_ids(p, chat=req.kind == "chat")) for text, p in prompts]

    async def tokenize(self, req: GenerationRequest) -> list[tuple[str | None, list[int]]]:
        """``prepare`` in a worker thread (the tokenizer releases the GIL while it encodes), so neither the
        event loop nor the engine's steps wait for a long prompt."""
        return await asyncio.to_thread(self.prepare, req)

    def check_fits(self, n_prompt: int, req: GenerationRequest) -> int:
        """The request's ``max_tokens`` once it fits the context length, the executor (a press's window) and
        the KV pool (else a 400)."""
        engine = self.aengine.engine
        limit, max_tokens = engine.max_model_len, req.requested_max_tokens
        if max_tokens is None:  # chat without max_tokens: the context left (vLLM), within what the pool holds
            bm = engine.block_manager
            room = min(limit, bm.num_blocks * bm.block_size) - n_prompt
            max_tokens = room if room >= 1 else limit - n_prompt  # no room in the pool: its check says so
        self.refuse_over_context(n_prompt, max_tokens, req)
        try:
            engine.executor.check_prompt(n_prompt)  # e.g. a KV press whose window is longer than the prompt
        except ValueError as exc:
            raise APIError(400, str(exc), "prompt", "invalid_value") from None
        try:
            check_fits_pool(engine.block_manager, n_prompt, max_tokens)
        except PoolTooSmall as exc:
            hint = " (start the server with a larger --num-gpu-blocks-override, or shorten the request)"
            raise APIError(400, f"{exc}{hint}", "max_tokens", "kv_cache_too_small") from None
        return max_tokens

    def refuse_over_context(self, n_prompt: int, max_tokens: int, req: GenerationRequest,
                            at_least: bool = False) -> None:
        """A 400 (OpenAI's message) when ``n_prompt`` + ``max_tokens`` (at least 1) exceed the context;
        ``at_least``: ``n_prompt`` is a lower bound from the text's length, not a count."""
        limit = self.aengine.engine.max_model_len
        if n_prompt + max(max_tokens, 1) <= limit and max_tokens >= 1:
            return
        param = "max_tokens" if n_prompt < limit else "messages" if req.kind == "chat" else "prompt"
        if at_least:
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt has at least "
                f"{n_prompt} tokens (its length in UTF-8 bytes over the {self.limits.max_token_bytes} bytes "
                "of the longest token). Please reduce the length of the prompt.",
                param, "context_length_exceeded")
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} "
            "for the completion). Please reduce the length of the prompt or of max_tokens.",
            param, "context_length_exceeded")

    def sampling(self, req: GenerationRequest, j: int) -> SamplingParams | None:
        """The parameters of the request's ``j``-th sequence of a prompt (None: plain greedy)."""
        logprobs = req.num_logprobs
        if not self.aengine.records_logprobs:  # a cost model: no logits to read or change
            needs_logits = {"logprobs": logprobs is not None,
                            "prompt_logprobs": req.prompt_logprobs is not None,
                            "min_p": req.min_p, "min_tokens": req.min_tokens,
                            "top_k": req.top_k, "logit_bias": req.logit_bias,
                            "repetition_penalty": req.repetition_penalty,
                            "frequency_penalty": req.frequency_penalty,
                            "presence_penalty": req.presence_penalty}
            for field, asked in needs_logits.items():
                if asked:
                    raise APIError(400, f"'{field}' needs logits; this server's executor has none "
                                   "(a cost model)", field, "invalid_value")
        bias = {int(k): float(v) for k, v in (req.logit_bias or {}).items()}
        vocab = self.tokenizer.vocab_size
        if any(t >= vocab for t in bias):  # vLLM refuses them too
            raise APIError(400, f"'logit_bias' has token id {max(bias)} outside the vocabulary [0, {vocab})",
                           "logit_bias", "invalid_value")
        temperature = 1.0 if req.temperature is None else float(req.temperature)
        # vLLM's children
        seed = 0 if not temperature else next(self._seeds) if req.seed is None else req.seed + j
        prompt_k = [k for k in (req.prompt_logprobs, logprobs if req.echo_prompt else None) if k is not None]
        params = SamplingParams(
            temperature=temperature, top_p=1.0 if req.top_p is None else float(req.top_p),
            seed=seed, top_k=max(req.top_k or 0, 0), min_p=float(req.min_p), min_tokens=req.min_tokens,
            repetition_penalty=req.repetition_penalty or 1.0, frequency_penalty=req.frequency_penalty or 0.0,
            presence_penalty=req.presence_penalty or 0.0, logit_bias=bias,
            stop_token_ids=tuple(sorted(set(req.stop_token_ids or ()))) if req.min_tokens else (),
            logprobs=logprobs, prompt_logprobs=max(prompt_k) if prompt_k else None,
        )
        return None if params == SamplingParams() else params

    async def submit(self, req: GenerationRequest) -> list[ChoiceRun]:
        """Every sequence of the request, queued (prompt by prompt, ``n`` each), or an error for
        all of them."""
        prompts = [(text, ids, self.check_fits(len(ids), req)) for text, ids in await self.tokenize(req)]
        queue = self.aengine.max_waiting
        if queue is not None and len(prompts) * req.n > max(queue, 1):  # never fits the queue: no retry-later
            raise APIError(400, f"this request asks for {len(prompts) * req.n} sequences "
                           f"({len(prompts)} prompts x n={req.n}); this server queues at most "
                           f"{self.aengine.max_waiting} (--max-waiting)", "n", "invalid_value")
        runs: list[ChoiceRun] = []
        try:
            for p, (text, ids, max_tokens) in enumerate(prompts):
                for j in range(req.n):
                    handle = self.aengine.submit(ids, max_tokens, self.sampling(req, j), req.ignore_eos)
                    runs.append(ChoiceRun(self, req, p * req.n + j, handle, p, text))
        except (Overloaded, APIError) as exc:
            for run in runs:
                self.aengine.release(run.handle)
            if isinstance(exc, APIError):
                raise
            raise APIError(503, str(exc), code="server_overloaded") from None
        return runs

    async def respond(self, request: Request, req: GenerationRequest):
        """The HTTP response to a validated request: an SSE stream, or one JSON body."""
        runs = await self.submit(req)
        rid, model = new_id(req.kind), req.model or self.model_name
        n_prompt = sum(len(run.handle.prompt_token_ids) for run in runs[:: req.n])
        if req.stream:
            return _ReleasingStream(self._stream(req, rid, model, runs, n_prompt), self.aengine, runs)
        try:
            return await self._collect_or_disconnect(request, req, rid, model, runs, n_prompt)
        finally:
            for run in runs:
                self.aengine.release(run.handle)

    # ---- while the engine runs it ----
    async def _stream(self, req: GenerationRequest, rid: str, model: str, runs: list[ChoiceRun],
                      n_prompt: int):
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(run: ChoiceRun) -> None:
            try:
                async for body in run.chunks():
                    await merged.put(chunk(req.kind, rid, model, [body], run.usage() if req.continuous_usage
                                           else None))
            except APIError as exc:  # headers are sent: report the error in the stream, as OpenAI does
                await merged.put(exc.body())
            finally:
                await merged.put(None)

        tasks = [asyncio.ensure_future(pump(run)) for run in runs]
        try:
            left = len(runs)
            while left:
                item = await merged.get()
                if item is None:
                    left -= 1
                else:
                    yield _sse(item)
            if req.include_usage:
                yield _sse(chunk(req.kind, rid, model, [], usage(n_prompt, sum(r.n_out for r in runs))))
            yield "data: [DONE]\n\n"
        finally:
            for task in tasks:
                task.cancel()

    async def _collect(self, req, rid: str, model: str, runs: list[ChoiceRun], n_prompt: int):
        choices = await asyncio.gather(*(run.collect() for run in runs))
        body = full_response(req.kind, rid, model, list(choices), n_prompt, sum(r.n_out for r in runs))
        if req.kind == "chat" and req.prompt_logprobs is not None:  # vLLM: beside the choices
            body["prompt_logprobs"] = runs[0].prompt_logprobs()
        return JSONResponse(body)

    async def _collect_or_disconnect(self, request: Request, req, rid, model, runs, n_prompt):
        task = asyncio.ensure_future(self._collect(req, rid, model, runs, n_prompt))
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if await request.is_disconnected():
                    for run in runs:
                        self.aengine.abort(run.handle)
                    return JSONResponse(error_body(400, "client disconnected"), status_code=499)
        finally:
            if not task.done():
                task.cancel()
