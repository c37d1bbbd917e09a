"""The OpenAI wire format, as vLLM's OpenAI-compatible server (v0.11) reads it: request models (pydantic) and
the error shape. Response and chunk bodies: ``longctx.serve.responses``.

``CompletionRequest`` and ``ChatCompletionRequest`` declare each field's type and bounds; a body is validated
against them, and ``longctx.serve.validation`` turns the first failure into one 400 in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` that names the field, says what is allowed and quotes
what came. Every field OpenAI or vLLM define is either honoured as vLLM honours it or refused with that
400 (``suffix``, tools the model would have to call, a non-text ``response_format``, ...). Numbers are read
as vLLM's pydantic models read them (``"0.5"`` is 0.5, ``4.0`` is 4; a boolean is no number); unknown fields
are ignored with a warning in the server's log that names them, as vLLM does, and so is ``user`` (a caller's
label, no effect on the answer in any server).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from longctx.engine.sampling_params import MAX_LOGPROBS

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_N = 64  # sequences per request (n x prompts): each holds KV blocks of its own
MAX_PROMPTS = 256  # prompts in one batched /v1/completions request


class APIError(Exception):
    """An error the server answers in OpenAI's shape with HTTP ``status``."""

    TYPES = {
        400: "invalid_request_error",
        404: "not_found_error",
        413: "invalid_request_error",
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
def _not_a_bool(value):
    if isinstance(value, bool):  # pydantic's lax mode reads true as 1; vLLM's fields are numbers
        raise ValueError("a boolean is not a number")
    return value


StrictInt = Annotated[int, Field(strict=True)]
StrictBool = Annotated[bool, Field(strict=True)]
NonEmptyStr = Annotated[str, Field(strict=True, min_length=1)]
# numbers as vLLM reads them (pydantic's lax mode): "0.5" -> 0.5, 4.0 and "4" -> 4; 4.5 is no integer
LaxInt = Annotated[int, BeforeValidator(_not_a_bool)]
LaxFloat = Annotated[float, BeforeValidator(_not_a_bool)]
Refused = Annotated[None, Field(description="not supported: the validator refuses any value")]


class TextPart(BaseModel):
    """A content part of a chat message: only text parts are supported."""

    type: Literal["text"]
    text: str = ""


class ToolCall(BaseModel):
    """An assistant's earlier call of a tool, in a conversation's history (OpenAI's shape)."""

    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: dict[str, Any]


class ChatMessage(BaseModel):
    """A message; ``content`` may be null (an assistant turn that only called tools, as OpenAI allows).
    ``tool_calls`` (an assistant's) and ``tool_call_id`` / ``name`` (a tool's answer) reach a Jinja chat
    template; SmolLM2's renders only each message's role and content."""

    model_config = ConfigDict(extra="ignore")
    role: Literal[ROLES]
    content: Annotated[str, Field(strict=True)] | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    @property
    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role  # OpenAI's newer name for system

    @property
    def template_dict(self) -> dict:
        """The message as a chat template reads it (``role``, ``content`` as text, and the tool fields
        when present)."""
        out = {"role": self.template_role, "content": self.text}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump(exclude_none=True) for c in self.tool_calls]
        for key in ("tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]  # json_object / json_schema: no guided decoding here (refused by name)


class GenerationRequest(BaseModel):
    """What both endpoints accept (in the order the fields are checked: the first failure is reported)."""

    model_config = ConfigDict(extra="ignore")
    kind: ClassVar[str]

    model: NonEmptyStr | None = None  # None: the served model (vLLM)
    max_tokens: Annotated[LaxInt | None, Field(ge=1)] = None
    n: Annotated[LaxInt, Field(ge=1, le=MAX_N)] = 1
    best_of: Annotated[LaxInt | None, Field(ge=1)] = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # vLLM: torch.long's range
    seed: Annotated[LaxInt | None, Field(ge=-(2**63), le=2**63 - 1)] = None
    # None: 1.0, OpenAI's default
    temperature: Annotated[LaxFloat | None, Field(ge=0.0, le=2.0)] = None
    top_p: Annotated[LaxFloat | None, Field(gt=0.0, le=1.0)] = None  # None: 1.0
    top_k: Annotated[LaxInt | None, Field(ge=-1)] = None  # -1 or 0: every token (vLLM)
    min_p: Annotated[LaxFloat, Field(ge=0.0, le=1.0)] = 0.0
    min_tokens: Annotated[LaxInt, Field(ge=0)] = 0
    ignore_eos: StrictBool = False
    repetition_penalty: Annotated[LaxFloat | None, Field(gt=0.0)] = None
    frequency_penalty: Annotated[LaxFloat | None, Field(ge=-2.0, le=2.0)] = None
    presence_penalty: Annotated[LaxFloat | None, Field(ge=-2.0, le=2.0)] = None
    logit_bias: dict[str, Annotated[LaxFloat, Field(ge=-100.0, le=100.0)]] | None = None
    response_format: ResponseFormat | None = None
    prompt_logprobs: Annotated[LaxInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: Literal[True] = True
    use_beam_search: Literal[False] = False
    user: str | None = None
    # vLLM's extra fields this server does not implement: refused (400 naming the field), never ignored
    length_penalty: Literal[1, 1.0] = 1.0
    truncate_prompt_tokens: Refused = None
    allowed_token_ids: Refused = None
    bad_words: Refused = None
    guided_json: Refused = None
    guided_regex: Refused = None
    guided_choice: Refused = None
    guided_grammar: Refused = None
    structured_outputs: Refused = None
    return_tokens_as_token_ids: Literal[False] = False

    @field_validator("stop")
    @classmethod
    def _stop_strings_not_empty(cls, value):
        if value == "" or (isinstance(value, list) and "" in value):
            raise ValueError("empty stop string")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys_are_token_ids(cls, value):
        for key in value or {}:
            if not (key.isascii() and key.isdigit()) or len(key) > 18:  # int() of 5,000 digits raises
                raise ValueError(f"key {key[:40]!r} is not a token id")
        return value

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of != n")
        return self

    @model_validator(mode="after")
    def _prompt_logprobs_not_streamed(self):  # vLLM's check
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs with stream")
        return self

    @model_validator(mode="after")
    def _stream_options_need_stream(self):  # vLLM's check; and usage per chunk needs usage asked for
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options without stream")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats \
                and not self.stream_options.include_usage:
            raise ValueError("continuous_usage_stats without include_usage")
        return self

    @property
    def stop_sequences(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_tokens`` as asked (None: the server picks, for chat)."""
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """How many top tokens to report per sampled token (None: no log-probabilities)."""
        return None

    @property
    def echo_prompt(self) -> bool:
        return False


def _first_number_field_is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``: one prompt or a batch, as text or token ids."""

    kind: ClassVar[str] = "completion"
    prompt: (NonEmptyStr | Annotated[list[StrictInt], Field(min_length=1)]
             | Annotated[list[NonEmptyStr], Field(min_length=1, max_length=MAX_PROMPTS)]
             | Annotated[list[Annotated[list[StrictInt], Field(min_length=1)]], Field(min_length=1,
                                                                                    max_length=MAX_PROMPTS)])
    echo: StrictBool = False
    logprobs: Annotated[LaxInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None
    suffix: Refused = None

    @property
    def prompts(self) -> list[str | list[int]]:
        """The batch: each prompt as text or token ids."""
        p = self.prompt
        if isinstance(p, str) or _first_number_field_is_int(p[0]):
            return [p]
        return list(p)

    @property
    def requested_max_tokens(self) -> int:
        return DEFAULT_COMPLETION_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def echo_prompt(self) -> bool:
        return self.echo


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``: a conversation, rendered with the model's chat template."""

    kind: ClassVar[str] = "chat"
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[LaxInt | None, Field(ge=1)] = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[LaxInt | None, Field(ge=0, le=MAX_LOGPROBS)] = None
    tools: list[dict[str, Any]] | None = None  # only with tool_choice "none": not shown to the model (vLLM)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    functions: Refused = None
    add_generation_prompt: StrictBool = True
    echo: Literal[False] = False  # vLLM's chat echo (repeat the last message): not implemented
    continue_final_message: StrictBool = False
    chat_template: NonEmptyStr | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: Refused = None

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs without logprobs")
        return self

    @model_validator(mode="after")
    def _tools_only_unused(self):  # no tool parser: vLLM without --enable-auto-tool-choice says the same
        if self.tool_choice not in (None, "none"):
            raise ValueError("tool_choice not none")
        if self.tools and self.tool_choice != "none":
            raise ValueError("tools without tool_choice none")
        return self

    @model_validator(mode="after")
    def _continue_or_generation_prompt(self):  # vLLM's check
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message with add_generation_prompt")
        return self

    @property
    def conversation(self) -> list[dict]:
        return [m.template_dict for m in self.messages]

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
