"""vLLM's tokenizer and version endpoints (v0.11): ``POST /tokenize``, ``POST /detokenize``,
``GET /tokenizer_info`` and ``GET /version``.

- ``/tokenize``: ``{"prompt": str}`` or ``{"messages": [...], "add_generation_prompt": true}`` ->
  ``{"count", "max_model_len", "tokens", "token_strs"}`` (``return_token_strs``: each token's text).
  ``add_special_tokens`` is accepted either way: SmolLM2's tokenizer adds no special token to a text.
- ``/detokenize``: ``{"tokens": [ids]}`` -> ``{"prompt": text}``.
- ``/tokenizer_info``: the EOS / BOS / pad tokens, the chat template and the context length: what
  lm-evaluation-harness reads to tokenize on the server (its ``RemoteTokenizer``) with no tokenizer download.
- ``/version``: ``{"version": longctx's version}``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from longctx.serve.chat import ChatRenderer
from longctx.serve.protocol import APIError, ChatMessage
from longctx.serve.validation import MAX_BODY_BYTES, parse_body


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: Annotated[str, Field(strict=True)] | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[Annotated[int, Field(strict=True)]]


def add_tokenizer_routes(app: FastAPI, tokenizer, max_model_len: int, check_model,
                         body_limit: int = MAX_BODY_BYTES, chat: ChatRenderer | None = None) -> None:
    """The routes; texts are tokenized in a worker thread (the event loop never waits for a long one)."""
    from longctx import __version__

    renderer = chat or ChatRenderer(tokenizer)

    def text_of(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await parse_body(request, TokenizeRequest, body_limit)
        if req.model is not None:
            check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "give exactly one of 'prompt' (a string) and 'messages' (a chat)", "prompt",
                           "invalid_value")
        if req.prompt is not None:
            text = req.prompt
        else:
            text = renderer.render([m.template_dict for m in req.messages], req.add_generation_prompt)

        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(400, "the text is not valid Unicode: a lone surrogate has no UTF-8 form", "prompt",
                           "invalid_value") from None

        def encode():
            ids = tokenizer.encode(text)
            return ids, [text_of(t) for t in ids] if req.return_token_strs else None

        ids, strs = await asyncio.to_thread(encode)
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse_body(request, DetokenizeRequest, body_limit)
        if req.model is not None:
            check_model(req.model)
        vocab = tokenizer.vocab_size
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", "tokens",
                           "invalid_value")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens)}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": text_of(tokenizer.eos_token_id),
            "bos_token": text_of(tokenizer.bos_token_id),
            "pad_token": None,
            "chat_template": tokenizer.chat_template,
            "model_max_length": max_model_len,
        }

    @app.get("/version")
    async def version():
        return {"version": __version__}
