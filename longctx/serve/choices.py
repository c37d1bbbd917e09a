"""``ChoiceRun``: one sequence of a request (one choice of the answer), from engine events to its text,
its finish reason and its log-probabilities.

It reads its ``RequestHandle``'s events (``longctx.serve.async_engine``), detokenizes incrementally with the
request's stop strings (``longctx.serve.detok``), ends the sequence at a stop string or a stop token id (an
abort: its blocks are freed at once; the finish reason is ``"stop"``), and keeps what the response needs:
the prompt's log-probabilities (``echo`` with ``logprobs``) and each generated token with its record.
``chunks()`` yields the choice's streamed chunk bodies; ``collect()`` its full-response choice.
"""

from __future__ import annotations

from longctx.serve.detok import IncrementalDetokenizer
from longctx.serve.protocol import APIError
from longctx.serve.responses import choice_body, usage


class ChoiceRun:
    """One sequence: ``index`` in the response's choices, its ``handle``, its prompt (``prompt_text``: as
    sent, or None for token ids or a chat)."""

    def __init__(self, generation, req, index: int, handle, prompt_index: int,
                 prompt_text: str | None) -> None:
        self.gen, self.req, self.index, self.handle = generation, req, index, handle
        self.prompt_index, self.prompt_text = prompt_index, prompt_text
        self.detok = IncrementalDetokenizer(generation.tokenizer, req.stop_sequences, req.min_tokens,
                                            req.include_stop_str_in_output)
        self.stop_ids = set(req.stop_token_ids or ())
        self.prompt_records: list = []
        self.tokens: list[tuple[int, object]] = []  # generated (token id, TokenLogprob | None)
        self.finish_reason: str | None = None

    @property
    def n_out(self) -> int:
        return len(self.tokens)

    def usage(self) -> dict:
        return usage(len(self.handle.prompt_token_ids), self.n_out)

    # ---- the engine's events ----
    async def events(self):
        """Yield ``(text_delta, new_tokens, None)`` per engine delivery, then
        ``(tail, [], finish_reason)``."""
        aengine = self.gen.aengine
        while True:
            kind, payload = await self.handle.events.get()
            if kind == "error":
                raise APIError(500, payload)
            if kind == "prompt_logprobs":
                self.prompt_records += payload
                continue
            if kind == "finish":
                self.finish_reason = payload
                yield self.detok.flush(), [], payload
                return
            for token_id, _time_s, record in payload:
                self.tokens.append((token_id, record))
                if token_id in self.stop_ids and self.n_out >= self.req.min_tokens:
                    aengine.abort(self.handle, stopped=True)  # the stop token's text is not returned
                    self.finish_reason = "stop"
                    yield self.detok.flush(), [(token_id, record)], "stop"
                    return
                delta = self.detok.add(token_id)
                if self.detok.stopped:
                    aengine.abort(self.handle, stopped=True)  # frees its blocks now; the stop string is cut
                    self.finish_reason = "stop"
                    yield delta, [(token_id, record)], "stop"
                    return
                yield delta, [(token_id, record)], None

    # ---- what the response shows ----
    def echo_text(self) -> str:
        if self.prompt_text is not None:
            return self.prompt_text
        return self.gen.tokenizer.decode(self.handle.prompt_token_ids)

    def echo_tokens(self) -> list[tuple[int, object]]:
        """The prompt's tokens with their records (the first has none), for ``echo`` with ``logprobs``."""
        ids, recs = self.handle.prompt_token_ids, self.prompt_records
        return [(ids[0], None)] + [(t, recs[i] if i < len(recs) else None) for i, t in enumerate(ids[1:])]

    def logprobs(self, tokens: list[tuple[int, object]], offset: int) -> dict | None:
        if self.req.num_logprobs is None:
            return None
        if self.req.kind == "completion":
            return self.gen.formatter.completion(tokens, offset)
        return self.gen.formatter.chat(tokens)

    def prompt_logprobs(self) -> list[dict | None] | None:
        """vLLM's ``prompt_logprobs`` of the prompt (None when the request did not ask)."""
        if self.req.prompt_logprobs is None:
            return None
        return self.gen.formatter.prompt(self.echo_tokens())

    async def collect(self) -> dict:
        """The full response's choice."""
        parts = [self.echo_text()] if self.req.echo_prompt else []
        async for text, _tokens, _finish in self.events():
            parts.append(text)
        tokens = (self.echo_tokens() if self.req.echo_prompt else []) + self.tokens
        body = choice_body(self.req.kind, self.index, "".join(parts), self.finish_reason or "stop",
                           self.logprobs(tokens, 0))
        if self.req.kind == "completion" and self.req.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs()
        return body

    async def chunks(self):
        """The streamed chunks' choice bodies: the echoed prompt (if asked), one per delivery, the last with
        the finish reason."""
        kind, offset, first, echo = self.req.kind, 0, True, self.req.echo_prompt
        async for text, tokens, finish in self.events():
            if echo:  # after the prompt's records arrived (they come before the first token)
                echo, prompt = False, self.echo_text()
                yield choice_body(kind, self.index, prompt, None, self.logprobs(self.echo_tokens(), 0),
                                  delta=True)
                offset, first = len(prompt), False
            yield choice_body(kind, self.index, text, finish,
                              self.logprobs(tokens, offset) if tokens else None, delta=True, first=first)
            offset, first = offset + len(text), False
