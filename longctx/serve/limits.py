"""What the context alone proves about a request, before any tokenizing: a lower bound on a text's tokens
and the largest body worth reading.

The bound. SmolLM2's tokenizer is byte-level BPE with no normalizer: the text's UTF-8 bytes are split into
runs and every token stands for one run (a special token written in the text, such as ``<|im_end|>``, for
its own spelling), so the runs tile the text and

    bytes(text) = sum of bytes(token) <= num_tokens * max_token_bytes,   i.e.
    num_tokens >= ceil(bytes(text) / max_token_bytes).

``max_token_bytes`` is measured once from the vocabulary: the UTF-8 length of each token decoded alone,
special tokens spelled out (81 bytes for SmolLM2: a newline and 80 spaces). Decoding can only lengthen a
token's bytes (a partial UTF-8 sequence decodes to U+FFFD, 3 bytes, for at most 3 raw bytes), so the
measured maximum is never below the true one and the bound stays safe. A text whose bound alone exceeds the
context is refused without being tokenized (``tests/test_server_limits.py`` checks the bound against the
tokenizer on texts built to be as short in tokens as possible).

The body cap. One context holds at most ``max_model_len * max_token_bytes`` bytes of text, and JSON writes a
byte as at most 6 (``\\u0001``), so a body of more than ``6 * max_model_len * max_token_bytes`` bytes (plus
room for the other fields) cannot be one prompt that fits: it is refused with a 413 before it is read.
A batch of prompts larger than that is sent in several requests.
"""

from __future__ import annotations

from longctx.memory import blocks_for_tokens

JSON_BYTES_PER_TEXT_BYTE = 6  # the longest JSON spelling of one UTF-8 byte: \u00XX
BODY_SLACK_BYTES = 2**20  # the other fields (stop lists, a logit_bias over the whole vocabulary, ...)


def max_token_bytes(tokenizer) -> int:
    """The most UTF-8 bytes one token of ``tokenizer`` stands for (each token decoded alone)."""
    return max(len(tokenizer.decode([i], skip_special_tokens=False).encode("utf-8"))
               for i in range(tokenizer.vocab_size))


class ContextLimits:
    """The bound and the cap for a tokenizer and a context of ``max_model_len`` tokens."""

    def __init__(self, tokenizer, max_model_len: int) -> None:
        self.max_model_len = int(max_model_len)
        self.max_token_bytes = max_token_bytes(tokenizer)
        self.body_limit_bytes = (JSON_BYTES_PER_TEXT_BYTE * self.max_token_bytes * self.max_model_len
                                 + BODY_SLACK_BYTES)

    def min_tokens(self, text: str) -> int:
        """A lower bound on the tokens of ``text`` (exact arithmetic on its UTF-8 length). Raises
        ``UnicodeEncodeError`` for a text with a lone surrogate (JSON's ``"\\ud800"``): no tokenizer takes
        it."""
        return blocks_for_tokens(len(text.encode("utf-8")), self.max_token_bytes)  # the one ceil division
