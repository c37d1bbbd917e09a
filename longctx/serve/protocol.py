"""The OpenAI wire format: request models (pydantic), error bodies, response and chunk bodies (plain dicts).

``CompletionRequest`` and ``ChatCompletionRequest`` declare each field's type and bounds; FastAPI validates a
body against them, and ``longctx.serve.validation`` turns the first failure into one 400 in OpenAI's error
shape ``{"error": {"message", "type", "param", "code"}}`` that says what is wrong and what is allowed.
Unknown fields are ignored, as OpenAI-compatible servers do; fields we cannot honour (``n > 1``,
``logprobs``, ``echo``, ``best_of``, ``suffix``) are refused rather than silently ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ROLES = ("system", "user", "assistant")
MAX_STOP_SEQUENCES = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


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


# ---- request models ----
StrictInt = Annotated[int, Field(strict=True)]
NonEmptyStr = Annotated[str, Field(strict=True, min_length=1)]


class TextPart(BaseModel):
    """A content part of a chat message: only text parts are supported."""

    type: Literal["text"]
    text: str = ""


class ChatMessage(BaseModel):
    role: Literal[ROLES]
    content: Annotated[str, Field(strict=True)] | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What both endpoints accept (in the order the fields are checked: the first failure is reported)."""

    model_config = ConfigDict(extra="ignore")
    kind: ClassVar[str]

    model: NonEmptyStr
    max_tokens: Annotated[int | None, Field(strict=True, ge=1)] = None
    n: Literal[1] = 1
    logprobs: Literal[False] | None = None
    top_logprobs: Literal[0] | None = None
    best_of: Literal[1] | None = None
    echo: Literal[False] | None = None
    suffix: None = None
    stop: NonEmptyStr | Annotated[list[NonEmptyStr], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: Annotated[bool, Field(strict=True)] = False
    stream_options: StreamOptions | None = None
    seed: Annotated[int | None, Field(strict=True)] = None
    temperature: Annotated[float | None, Field(strict=True, ge=0.0, le=2.0)] = None  # None: 1.0, OpenAI's default
    top_p: Annotated[float | None, Field(strict=True, gt=0.0, le=1.0)] = None  # None: 1.0

    @property
    def stop_sequences(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def sampling_temperature(self) -> float:
        return 1.0 if self.temperature is None else float(self.temperature)

    @property
    def sampling_top_p(self) -> float:
        return 1.0 if self.top_p is None else float(self.top_p)

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_tokens`` as asked (None: the server picks, for chat)."""
        return self.max_tokens


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    kind: ClassVar[str] = "completion"
    prompt: NonEmptyStr | Annotated[list[StrictInt], Field(min_length=1)]

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_text_prompt(cls, value):
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            return value[0]  # ["text"]: one prompt, as the openai client may send it
        return value

    @property
    def requested_max_tokens(self) -> int:
        return DEFAULT_COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: a conversation, rendered with the model's chat template."""

    kind: ClassVar[str] = "chat"
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(strict=True, ge=1)] = None

    @property
    def conversation(self) -> list[dict]:
        return [{"role": m.role, "content": m.text} for m in self.messages]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens


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
