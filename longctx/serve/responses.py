"""The OpenAI response bodies (plain dicts), as vLLM's server (v0.11) writes them: full responses, streamed
chunks, usage, and log-probabilities in both endpoints' formats.

- completions: ``choices[i].logprobs = {"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, one
  entry per token; with ``echo`` the prompt's tokens come first, the first of them with ``null`` (no context);
  ``top_logprobs[j]`` maps the ``k`` most likely tokens' text, and the chosen token's, to their
  log-probability.
- chat: ``choices[i].logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``.
- ``prompt_logprobs`` (vLLM's field): per prompt token ``{token id: {"logprob", "rank", "decoded_token"}}``,
  ``None`` for the first; in each choice for completions, at the top of the body for chat.

A token's text is its own decode (special tokens spelled out). ``n`` choices per prompt: choice
``prompt_index * n + j``, as vLLM numbers them. ``usage`` counts each prompt once and every generated token.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (no torch at run time)
    from longctx.engine.logprobs import TokenLogprob


def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class LogprobFormatter:
    """Token records (``TokenLogprob``, or None for a prompt's first token) -> either endpoint's format."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        t = self._text.get(token_id)
        if t is None:
            t = self._text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return t

    def completion(self, tokens: list[tuple[int, TokenLogprob | None]], offset: int = 0) -> dict:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``; ``offset``: where the first
        token's text starts in the choice's text."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, rec in tokens:
            text = self.text(token_id)
            out["tokens"].append(text)
            out["text_offset"].append(offset)
            offset += len(text)
            if rec is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            top = {self.text(t): lp for t, lp in rec.top}
            top.setdefault(text, rec.logprob)  # the chosen token is always there (vLLM)
            out["token_logprobs"].append(rec.logprob)
            out["top_logprobs"].append(top)
        return out

    def chat(self, tokens: list[tuple[int, TokenLogprob | None]]) -> dict:
        """``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``."""
        def entry(token_id: int, logprob: float) -> dict:
            text = self.text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        content = []
        for token_id, rec in tokens:
            if rec is not None:
                content.append({**entry(token_id, rec.logprob),
                                "top_logprobs": [entry(t, lp) for t, lp in rec.top]})
        return {"content": content}


    def prompt(self, tokens: list[tuple[int, TokenLogprob | None]]) -> list[dict | None]:
        """vLLM's ``prompt_logprobs``: ``None`` for the first prompt token, then per token a map from token id
        (a string) to ``{"logprob", "rank", "decoded_token"}`` for the prompt's token and the ``k`` most
        likely ones."""
        out: list[dict | None] = []
        for token_id, rec in tokens:
            if rec is None:
                out.append(None)
                continue
            entry = {str(t): {"logprob": lp, "rank": r + 1, "decoded_token": self.text(t)}
                     for r, (t, lp) in enumerate(rec.top)}
            entry.setdefault(str(token_id), {"logprob": rec.logprob, "rank": rec.rank,
                                             "decoded_token": self.text(token_id)})
            out.append(entry)
        return out


def choice_body(kind: str, index: int, text: str, finish_reason: str | None, logprobs: dict | None,
                delta: bool = False, first: bool = False) -> dict:
    """One choice of a full response (``delta=False``) or of a streamed chunk."""
    if kind == "completion":
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if delta:
        message = {"role": "assistant", "content": text} if first else {"content": text}
        return {"index": index, "delta": message, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish_reason}


def full_response(kind: str, rid: str, model: str, choices: list[dict], n_prompt: int, n_out: int) -> dict:
    return {
        "id": rid,
        "object": "text_completion" if kind == "completion" else "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(n_prompt, n_out),
    }


def chunk(kind: str, rid: str, model: str, choices: list[dict], usage_body: dict | None = None) -> dict:
    """A streamed chunk: ``choices`` (one, or none for the final usage chunk), and ``usage`` when asked."""
    body = {
        "id": rid,
        "object": "text_completion" if kind == "completion" else "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
    if usage_body is not None:
        body["usage"] = usage_body
    return body
