"""The OpenAI wire format: request validation, error bodies, response and chunk bodies (plain dicts).

Validation is explicit (not a schema library) so each 400 says what is wrong and what is allowed, in
OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``. Unknown fields are ignored, as
OpenAI-compatible servers do; fields we cannot honour (``n > 1``, ``logprobs``, ``echo``, ``best_of``) are
refused rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

ROLES = ("system", "user", "assistant")
MAX_STOP_SEQUENCES = 4


class APIError(Exception):
    """An error the server answers in OpenAI's shape with HTTP ``status``."""

    TYPES = {
        400: "invalid_request_error",
        404: "not_found_error",
        503: "server_overloaded",
        500: "server_error",
    }

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = int(status), message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": APIError.TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code,
        }
    }


@dataclass
class GenerationRequest:
    """A validated request. ``prompt`` is text (completions) or ``messages`` (chat)."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str | list[int] | None
    messages: list[dict] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    stream: bool
    include_usage: bool


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(f"'{name}' must be a number, got {value!r}", name)
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise _bad(f"'{name}' must be in {bound}, got {value}", name)
    return float(value)


def _int_or_none(body: dict, name: str, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise _bad(f"'{name}' must be an integer >= {lo}, got {value!r}", name)
    return int(value)


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}] needs a 'role' in {list(ROLES)}, got {m!r}"[:300], "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text parts are supported
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise _bad(f"messages[{i}].content: only parts of type 'text' are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content must be a string, got {type(content).__name__}", "messages")
        out.append({"role": m["role"], "content": content})
    return out


def parse_request(body, kind: str) -> GenerationRequest:
    """Validate a /v1/completions (``kind="completion"``) or /v1/chat/completions (``"chat"``) body."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required (a string; GET /v1/models lists them)", "model")
    prompt = messages = None
    if kind == "completion":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            pass  # token ids
        elif not isinstance(prompt, str) or not prompt:
            raise _bad(
                "'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
                "prompt",
            )
    else:
        messages = _messages(body.get("messages"))
    max_tokens = _int_or_none(body, "max_tokens", 1)
    if kind == "chat" and max_tokens is None:
        max_tokens = _int_or_none(body, "max_completion_tokens", 1)
    if kind == "completion" and max_tokens is None:
        max_tokens = 16  # OpenAI's default for completions
    n = body.get("n", 1)
    if n != 1:
        raise _bad(f"only n=1 is supported, got n={n!r}", "n")
    unsupported = (
        ("logprobs", (None, False)),
        ("top_logprobs", (None, 0)),
        ("best_of", (None, 1)),
        ("echo", (None, False)),
        ("suffix", (None,)),
    )
    for name, allowed in unsupported:
        if body.get(name) not in allowed:
            raise _bad(f"'{name}'={body.get(name)!r} is not supported by this server", name)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or not all(isinstance(s, str) and s for s in stop)
        or len(stop) > MAX_STOP_SEQUENCES
    ):
        raise _bad(
            f"'stop' must be a non-empty string or a list of up to {MAX_STOP_SEQUENCES} of them", "stop"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"'stream' must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("'stream_options' must be an object", "stream_options")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad(f"'seed' must be an integer, got {seed!r}", "seed")
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        messages=messages,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        seed=seed,
        stop=stop,
        stream=stream,
        include_usage=bool(options.get("include_usage", False)),
    )


# ---- response bodies ----
def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def full_response(
    req: GenerationRequest, rid: str, text: str, finish_reason: str, n_prompt: int, n_out: int
) -> dict:
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [choice],
        "usage": usage(n_prompt, n_out),
    }


def chunk(req: GenerationRequest, rid: str, text: str, finish_reason: str | None, first: bool) -> dict:
    """One streamed chunk (one generated token): the text it adds, and the finish reason on the last."""
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": req.model, "choices": [choice]}


def usage_chunk(req: GenerationRequest, rid: str, n_prompt: int, n_out: int) -> dict:
    obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "choices": [],
        "usage": usage(n_prompt, n_out),
    }
