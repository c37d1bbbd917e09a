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
import logging
from collections.abc import Sequence

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from longctx.engine.sampling_params import MAX_LOGPROBS
from longctx.serve.protocol import MAX_N, MAX_PROMPTS, ROLES, APIError

FIELD_ORDER = ("model", "prompt", "messages", "max_tokens", "max_completion_tokens", "n", "best_of", "echo",
               "logprobs", "top_logprobs", "suffix", "stop", "stop_token_ids", "stream", "stream_options",
               "seed", "temperature", "top_p", "top_k", "min_p", "min_tokens", "ignore_eos",
               "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "response_format",
               "tools", "tool_choice", "functions", "prompt_logprobs", "include_stop_str_in_output",
               "continue_final_message", "chat_template", "chat_template_kwargs",
               "skip_special_tokens", "use_beam_search", "user")
RANGES = {  # the numbers' allowed ranges, as written
    "temperature": "[0.0, 2.0]", "top_p": "(0.0, 1.0]", "min_p": "[0.0, 1.0]",
    "repetition_penalty": "(0.0, inf)",
    "frequency_penalty": "[-2.0, 2.0]", "presence_penalty": "[-2.0, 2.0]",
}
INTEGERS = {  # integer fields: what is allowed
    "max_tokens": "an integer >= 1", "max_completion_tokens": "an integer >= 1", "seed": "an integer",
    "n": f"an integer in [1, {MAX_N}]",
    "best_of": "equal to n or left out (every sequence drawn is returned: none are ranked and dropped)",
    "logprobs": f"an integer in [0, {MAX_LOGPROBS}] for /v1/completions, true or false for chat",
    "top_logprobs": f"an integer in [0, {MAX_LOGPROBS}], with logprobs: true",
    "top_k": "an integer >= 1, or -1 or 0 for every token", "min_tokens": "an integer >= 0",
    "prompt_logprobs": f"an integer in [0, {MAX_LOGPROBS}]",
}
BOOLEANS = ("stream", "echo", "ignore_eos", "include_stop_str_in_output", "continue_final_message",
            "add_generation_prompt")
REFUSED = {  # fields this server does not implement: what it says instead of ignoring them
    "suffix": "'suffix' is not supported by this server (no fill-in-the-middle)",
    "skip_special_tokens": "'skip_special_tokens' is not supported by this server (only true)",
    "use_beam_search": "'use_beam_search' is not supported by this server (only false)",
    "tools": "'tools' must be a list of tool objects",
    "tool_choice": "'tool_choice' must be \"none\" (or left out without tools): this server has no tool-call "
                   "parser (SmolLM2's chat template has no tool calling)",
    "functions": "'functions' is not supported by this server: SmolLM2's chat template has no tool calling",
    "response_format": "'response_format' must be {\"type\": \"text\"}: json_object and json_schema need "
                       "guided decoding, which this server does not have",
    "chat_template_kwargs": "'chat_template_kwargs' must be an object (the chat template's variables)",
    "chat_template": "'chat_template' must be a non-empty string (a Jinja template)",
    "logit_bias": "'logit_bias' must map token ids (strings of digits) to numbers in [-100, 100]",
    "stop": "'stop' must be a non-empty string or a list of non-empty strings",
    "stop_token_ids": "'stop_token_ids' must be a list of token ids",
    "stream_options": "'stream_options' must be an object with boolean include_usage, continuous_usage_stats",
    "user": "'user' must be a string",
}
LOG = logging.getLogger("longctx.serve")
MAX_BODY_BYTES = 32 * 2**20  # without a context to size it from (``longctx.serve.limits`` sizes the server's)
NOT_A_NUMBER = ("float_type", "float_parsing", "missing", "value_error")
MODEL_CHECKS = {  # a model validator's message -> (the field it is about, what the 400 says; None: by field)
    "best_of != n": ("best_of", None),
    "top_logprobs without logprobs": ("top_logprobs", None),
    "stream_options without stream": (
        "stream_options", "'stream_options' needs \"stream\": true (as vLLM's server says)"),
    "prompt_logprobs with stream": (
        "prompt_logprobs", "'prompt_logprobs' are not available with \"stream\": true (as in vLLM)"),
    "tool_choice not none": ("tool_choice", None),
    "tools without tool_choice none": (
        "tools", "'tools' are accepted only with tool_choice \"none\" (vLLM then leaves them out of the "
        "prompt): this server has no tool-call parser and SmolLM2's chat template has no tool calling"),
    "continue_final_message with add_generation_prompt": (
        "continue_final_message", "'continue_final_message' continues the last message, so it needs "
        "add_generation_prompt: false (as vLLM says)"),
    "continuous_usage_stats without include_usage": (
        "stream_options", "'stream_options.continuous_usage_stats' reports usage in every chunk, so it needs "
        "include_usage: true"),
}


def _message(field: str, err: dict, body) -> str:
    """What is wrong with ``field`` and what is allowed (``err``: the first pydantic error on it)."""
    value = err.get("input")
    if field == "model":
        return "'model' must be a non-empty string (GET /v1/models lists them) or left out"
    if field == "prompt":
        return ("'prompt' must be a non-empty string, a list of token ids, or a batch of up to "
                f"{MAX_PROMPTS} of either (a list of strings or a list of token-id lists)")
    if field == "messages":
        return _messages_message(err, body)
    said = next((text for m, (_, text) in MODEL_CHECKS.items() if m in str(err.get("msg", ""))), None)
    if said is not None:
        return said
    if field in REFUSED:
        return REFUSED[field]
    if err["type"] in ("none_required", "literal_error") and field not in FIELD_ORDER[:6]:
        allowed = ("" if err["type"] == "none_required"
                   else f" (only {err.get('ctx', {}).get('expected', '')})")
        return f"'{field}' is not supported by this server{allowed}"
    if field in INTEGERS:
        if field == "logprobs" and err["type"] == "bool_type":
            return "'logprobs' must be true or false for chat (top_logprobs says how many)"
        return f"'{field}' must be {INTEGERS[field]}, got {value!r}"
    if field in BOOLEANS:
        return f"'{field}' must be true or false, got {value!r}"
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
    if len(loc) > 3 and loc[3] == "tool_calls":
        return (f"messages[{i}].tool_calls must be a list of "
                "{\"type\": \"function\", \"function\": {...}} objects")
    if len(loc) > 3 and loc[3] == "content":
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            return f"messages[{i}].content: only parts of type 'text' are supported"
        return (f"messages[{i}].content must be a string, a list of text parts or null, "
                f"got {type(content).__name__}")
    return f"messages[{i}] needs a 'role' in {list(ROLES)}, got {message!r}"[:300]


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The raw body, refused with a 413 past ``limit`` bytes (before reading it all when Content-Length says
    so)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body is {declared} bytes; the limit is {limit} (what one context "
                       "can hold; send a larger batch in several requests)", code="body_too_large")
    chunks, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")
        chunks.append(part)
    return b"".join(chunks)


async def parse_body(request: Request, model: type[BaseModel], limit: int = MAX_BODY_BYTES):
    """The body of ``request`` (at most ``limit`` bytes, else a 413) validated as ``model``; raises
    ``RequestValidationError`` (or a 400 for a body that is not JSON)."""
    raw = await read_body(request, limit)
    try:
        body = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4,300 digits
        raise APIError(400, f"the request body is not valid JSON: {str(exc)[:200]}",
                       code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body is not valid JSON: nested too deeply",
                       code="invalid_json") from None
    try:
        parsed = model.model_validate(body)
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply", code="invalid_value") from None
    except ValidationError as exc:  # located as FastAPI locates body errors: ("body", field, ...)
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors, body=body) from None
    ignored = sorted(set(body) - set(model.model_fields))  # a dict: the model validated it
    if ignored:  # as vLLM's server does: the request runs, the log names what it ignored
        LOG.warning("%s: fields present in the request but ignored: %s", request.url.path,
                    ", ".join(ignored)[:300])
    return parsed


def to_api_error(errors: Sequence[dict], body) -> APIError:
    """The 400 for a body that failed validation (``errors``: pydantic's list; ``body``: the parsed JSON)."""
    if not errors:
        return APIError(400, "the request body is not valid", code="invalid_value")
    if not isinstance(body, dict):
        return APIError(400, "the request body must be a JSON object", code="invalid_json")

    def field_of(err: dict) -> str:
        if len(err["loc"]) > 1:
            return str(err["loc"][1])
        msg = str(err.get("msg", ""))  # a check across fields has no field of its own in pydantic's loc
        return next((name for check, (name, _) in MODEL_CHECKS.items() if check in msg), "")

    def rank(err: dict) -> int:
        field = field_of(err)
        return FIELD_ORDER.index(field) if field in FIELD_ORDER else len(FIELD_ORDER)

    err = min(errors, key=rank)  # the first field in FIELD_ORDER that failed (min keeps pydantic's order)
    field = field_of(err)
    if not field:
        return APIError(400, f"the request body is not valid: {err.get('msg', '')}", code="invalid_value")
    if len(err["loc"]) == 1:
        err = {**err, "input": body.get(field)}
    return APIError(400, _message(field, err, body), field, "invalid_value")
