"""The HTTP layer: a FastAPI app exposing the engine with OpenAI's API.

Routes, as vLLM's OpenAI-compatible server (v0.11) has them: ``POST /v1/completions`` (one prompt or a batch,
text or token ids; ``echo``, ``logprobs``, ``prompt_logprobs``), ``POST /v1/chat/completions`` (the model's
chat template or a Jinja one, ``longctx.serve.chat``; ``logprobs``, ``top_logprobs``), ``GET /v1/models``,
``GET /v1/models/{id}``, ``GET /health`` (200 with pool and queue occupancy while the engine loop runs, else
503), ``GET|POST /ping`` (the same status, no body), ``GET /metrics`` (Prometheus text format under vLLM's
names: ``longctx.serve.prometheus``), ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``,
``GET /version`` (``longctx.serve.tokenizer_routes``). ``model`` may be left out: the served model answers.
With an API key every ``/v1`` route answers 401 without ``Authorization: Bearer <key>`` (``BearerAuth``).

Streaming (``"stream": true``) is Server-Sent Events: one ``data: {chunk}`` per generated token (its text
delta; empty while a multi-byte character or a possible stop string is held back), then a chunk with the
``finish_reason``, then, with ``stream_options.include_usage``, a chunk with ``usage``, then
``data: [DONE]``. ``usage`` counts real tokens: the prompt as tokenized (with the chat template for chat),
and every generated token including the EOS that ended it.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for bad parameters (the
request models in ``protocol``, one handler in ``validation``; a body nested too deeply for the JSON parser
included), for a prompt + max_tokens over the context length or the KV pool, and for a batch with more
sequences (prompts x n) than ``max_waiting`` allows; 401 without the API key; 413 for a body larger than one
context can hold (``longctx.serve.limits``); 404 for an unknown model or route; 503 when ``max_waiting``
requests already wait for KV blocks (retry later; no limit by default, as vLLM) or the engine loop is down. A
client that disconnects (streaming or not) has its request aborted and its KV blocks freed at the next step
boundary (``generation``).
"""

from __future__ import annotations

import contextlib
import hmac
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from longctx.serve.async_engine import AsyncEngine
from longctx.serve.chat import ChatRenderer
from longctx.serve.generation import Generation
from longctx.serve.limits import ContextLimits
from longctx.serve.prometheus import PREFIX, EngineCollector, exposition, metrics_registry
from longctx.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest, error_body
from longctx.serve.tokenizer_routes import add_tokenizer_routes
from longctx.serve.validation import parse_body, to_api_error

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def create_app(
    aengine: AsyncEngine,
    tokenizer,
    model_name: str = DEFAULT_MODEL_NAME,
    aliases: tuple[str, ...] = ("SmolLM2-135M-Instruct",),
    base_seed: int = 0,
    cache_dtype: str = "auto",
    kv_press: str = "none",
    api_key: str | None = None,
    chat: ChatRenderer | None = None,
    metrics_prefix: str = PREFIX,
) -> FastAPI:
    """The FastAPI app. The engine loop starts with the app (lifespan) and stops with it.

    ``cache_dtype`` and ``kv_press`` only label ``/metrics``' ``cache_config_info`` (the engine
    holds the rest); ``api_key``: every ``/v1`` route answers 401 without ``Authorization: Bearer <api_key>``
    (vLLM's ``--api-key``); ``chat``: how chats become prompts (default: the tokenizer's template);
    ``metrics_prefix``: the namespace of ``/metrics`` (vLLM's by default).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app):
        aengine.start()
        yield
        aengine.stop()

    app = FastAPI(title="longctx serve", lifespan=lifespan)
    _add_error_handlers(app)
    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key)
    limits = ContextLimits(tokenizer, aengine.engine.max_model_len)
    collector = EngineCollector(aengine, model_name, cache_dtype, kv_press, metrics_prefix)
    _add_info_routes(app, aengine, model_name, collector)
    names = {model_name, *aliases}

    def check_model(name: str | None) -> None:
        if name is not None and name not in names:
            raise APIError(
                404,
                f"The model `{name}` does not exist; this server has {model_name!r}",
                "model",
                "model_not_found",
            )

    created = int(time.time())

    @app.get("/v1/models/{name:path}")
    async def model_card(name: str):
        check_model(name)
        return _card(aengine, name, created)

    chat = chat or ChatRenderer(tokenizer)
    generation = Generation(aengine, tokenizer, base_seed, model_name, limits, chat)
    _add_generation_routes(app, generation, check_model, limits.body_limit_bytes)
    add_tokenizer_routes(app, tokenizer, aengine.engine.max_model_len, check_model, limits.body_limit_bytes,
                         generation.chat)
    return app


def _card(aengine: AsyncEngine, name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "longctx",
            "max_model_len": aengine.engine.max_model_len}


class BearerAuth:
    """ASGI middleware: a request to a ``/v1`` route without ``Authorization: Bearer <api_key>`` gets a 401
    in OpenAI's shape (vLLM's ``--api-key``; ``/health``, ``/metrics``, ``/ping`` and the tokenizer routes
    stay open, as in vLLM; an ``OPTIONS`` preflight passes)."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self._expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] == "http" and scope["method"] != "OPTIONS"
                and scope["path"].startswith("/v1")):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                body = error_body(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                                  None, "invalid_api_key")
                await JSONResponse(body, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error leaves in OpenAI's shape: ours, FastAPI's validation errors, unknown routes, crashes."""

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        err = to_api_error(exc.errors(), exc.body)
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        msg = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(error_body(exc.status_code, msg), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500)


def _add_info_routes(app: FastAPI, aengine: AsyncEngine, model_name: str, collector: EngineCollector) -> None:
    created = int(time.time())
    registry, observer = metrics_registry(collector, aengine.engine.max_model_len)
    aengine.observer = observer

    @app.get("/health")
    async def health():
        body = {"status": "ok" if aengine.healthy else "error", **aengine.stats()}
        if aengine.loop_error:
            body["error"] = aengine.loop_error
        return JSONResponse(body, status_code=200 if aengine.healthy else 503)

    @app.get("/ping")
    @app.post("/ping")
    async def ping():
        return Response(status_code=200 if aengine.healthy else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_card(aengine, model_name, created)]}

    @app.get("/metrics")
    async def metrics():
        body, content_type = exposition(registry)
        return Response(body, media_type=content_type)


def _add_generation_routes(app: FastAPI, generation: Generation, check_model, body_limit: int) -> None:
    async def respond(request: Request, model: type[CompletionRequest | ChatCompletionRequest]):
        req = await parse_body(request, model, body_limit)
        check_model(req.model)
        return await generation.respond(request, req)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await respond(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await respond(request, ChatCompletionRequest)
