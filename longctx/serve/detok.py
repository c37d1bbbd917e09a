"""Incremental detokenization with stop strings: token ids in, text deltas out.

Byte-level BPE can split one character over several tokens; decoding a prefix then ends in U+FFFD. Each
new token is decoded with the tokens since the last complete character only (vLLM's prefix and read offsets:
``decode(ids[prefix:])`` minus ``decode(ids[prefix:read])``), so a token costs the same at the 8,000th as at
the first (decoding the whole output each time costs ~6 ms at 8,000 tokens, on the event loop, per stream);
a trailing U+FFFD is held back until the next token completes the character. With stop strings, text that
could still be the start of a stop string is held back too, and
when a stop string appears the text is cut just before it (OpenAI's convention: the stop string is not
returned; with vLLM's ``include_stop_str_in_output`` just after it). A character still incomplete when the
output ends (``max_tokens`` cut it) is left out rather than sent as U+FFFD. Special tokens
(``<|im_end|>``) decode to nothing. Before ``min_tokens`` tokens no stop string counts (vLLM's rule).
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Feed token ids one at a time; ``add`` returns the new text that is safe to send."""

    def __init__(self, tokenizer, stop: list[str] | None = None, min_tokens: int = 0,
                 include_stop: bool = False) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self.min_tokens = int(min_tokens)
        self.include_stop = bool(include_stop)
        self.token_ids: list[int] = []
        self.text = ""  # the decoded text of token_ids[:self._read] (complete characters)
        self._prefix = 0  # tokens decoded again as context before the new ones
        self._read = 0  # tokens whose text is in self.text
        self.sent = ""  # text already returned
        self.stopped = False  # a stop string was found
        self._search_from = 0  # stop strings are looked for from here (text sent before min_tokens is final)

    def _visible(self, text: str) -> str:
        """The prefix of ``text`` that can be sent now."""
        if len(self.token_ids) < self.min_tokens:  # no stop string counts yet (vLLM's min_tokens)
            visible = text[:-1] if text.endswith("\ufffd") else text
            self._search_from = len(visible)
            return visible
        found = [(at, len(s)) for at, s in ((text.find(s, self._search_from), s) for s in self.stop)
                 if at != -1]
        if found:
            self.stopped = True
            at, length = min(found)
            return text[: at + length] if self.include_stop else text[:at]
        hold = 0
        for s in self.stop:  # the longest tail of text that is a proper prefix of a stop string
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        if text.endswith("\ufffd"):
            hold = max(hold, 1)
        return text[: len(text) - hold]

    def _decoded(self) -> str:
        """The text of every token so far (ending in U+FFFD while a character is incomplete)."""
        ids, decode = self.token_ids, self.tokenizer.decode
        done = decode(ids[self._prefix:self._read])
        new = decode(ids[self._prefix:])
        tail = new[len(done):] if new.startswith(done) else new
        if new.endswith("\ufffd"):
            return self.text + tail
        self.text += tail
        self._prefix, self._read = self._read, len(ids)
        return self.text

    def add(self, token_id: int) -> str:
        """Append one token; return the text delta to send (may be empty)."""
        if self.stopped:
            return ""
        self.token_ids.append(int(token_id))
        visible = self._visible(self._decoded())
        if len(visible) <= len(self.sent):
            return ""
        delta = visible[len(self.sent) :]
        self.sent = visible
        return delta

    def flush(self) -> str:
        """At the end of the output: release held-back text (no stop string can complete any more), except
        a character whose bytes were cut (``max_tokens`` inside a multi-byte character): never U+FFFD."""
        if self.stopped:
            return ""
        text = self._decoded().rstrip("\ufffd")
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text
        return delta
