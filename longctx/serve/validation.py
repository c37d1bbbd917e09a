"""Request bodies into request models, and one handler for every body that fails: a 400 in OpenAI's shape.

``parse_body`` reads the body as JSON whatever its content type (as the server always did: ``curl -d``
sends a form content type) and validates it with the route's model (``longctx.serve.protocol``); a failure
is raised as FastAPI's ``RequestValidationError``, the one kind the app's single handler renders. pydantic
reports each failure as ``{"loc": ("body", field, ...), "type", "input", "ctx"}``; ``to_api_error``
reports the first one (in the order the fields were checked before there were models: model, prompt or
messages, max_tokens, ...) with a message that names the field, says what is allowed and quotes what came,
and ``param`` set to the field, as OpenAI does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from longctx.serve.protocol import MAX_STOP_SEQUENCES, ROLES, APIError

FIELD_ORDER = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "logprobs",
               "top_logprobs", "best_of", "echo", "suffix", "stop", "stream", "stream_options", "seed",
               "temperature", "top_p")
RANGES = {"temperature": "[0.0, 2.0]", "top_p": "(0.0, 1.0]"}  # the numbers' allowed ranges, as written
UNSUPPORTED = ("logprobs", "top_logprobs", "best_of", "echo", "suffix")
NOT_A_NUMBER = ("float_type", "float_parsing", "missing")


def _message(field: str, err: dict, body) -> str:
    """What is wrong with ``field`` and what is allowed (``err``: the first pydantic error on it)."""
    value = err.get("input")
    if field == "model":
        return "'model' is required (a string; GET /v1/models lists them)"
    if field == "prompt":
        return "'prompt' must be a non-empty string or a list of token ids (one prompt per request)"
    if field == "messages":
        return _messages_message(err, body)
    if field in ("max_tokens", "max_completion_tokens"):
        return f"'{field}' must be an integer >= 1, got {value!r}"
    if field == "n":
        return f"only n=1 is supported, got n={value!r}"
    if field in UNSUPPORTED:
        return f"'{field}'={value!r} is not supported by this server"
    if field == "stop":
        return f"'stop' must be a non-empty string or a list of up to {MAX_STOP_SEQUENCES} of them"
    if field == "stream":
        return f"'stream' must be true or false, got {value!r}"
    if field == "stream_options":
        return "'stream_options' must be an object"
    if field == "seed":
        return f"'seed' must be an integer, got {value!r}"
    if field in RANGES:
        if err["type"] in NOT_A_NUMBER:
            return f"'{field}' must be a number, got {value!r}"
        return f"'{field}' must be in {RANGES[field]}, got {value}"
    return f"'{field}' is not valid: {err.get('msg', '')}"


def _messages_message(err: dict, body) -> str:
    loc = err["loc"]
    if len(loc) < 3 or not isinstance(loc[2], int):
        return "'messages' must be a non-empty list of {role, content} objects"
    i = loc[2]
    message = body["messages"][i] if isinstance(body, dict) else None
    if len(loc) > 3 and loc[3] == "content":
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            return f"messages[{i}].content: only parts of type 'text' are supported"
        return f"messages[{i}].content must be a string, got {type(content).__name__}"
    return f"messages[{i}] needs a 'role' in {list(ROLES)}, got {message!r}"[:300]


async def parse_body(request: Request, model: type[BaseModel]):
    """The body of ``request`` validated as ``model``; raises ``RequestValidationError`` (or a 400 for a body
    that is not JSON)."""
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    try:
        return model.model_validate(body)
    except ValidationError as exc:  # located as FastAPI locates body errors: ("body", field, ...)
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors, body=body) from None


def to_api_error(errors: Sequence[dict], body) -> APIError:
    """The 400 for a body that failed validation (``errors``: pydantic's list; ``body``: the parsed JSON)."""
    if not errors:
        return APIError(400, "the request body is not valid", code="invalid_value")
    if len(errors[0]["loc"]) < 2 or not isinstance(body, dict):
        return APIError(400, "the request body must be a JSON object", code="invalid_json")

    def rank(err: dict) -> int:
        field = err["loc"][1] if len(err["loc"]) > 1 else ""
        return FIELD_ORDER.index(field) if field in FIELD_ORDER else len(FIELD_ORDER)

    err = min(errors, key=rank)  # the first field in FIELD_ORDER that failed (min keeps pydantic's order)
    field = str(err["loc"][1])
    return APIError(400, _message(field, err, body), field, "invalid_value")
