"""Incremental detokenization: text deltas add up to the full decode; stop strings are cut even when they
span tokens and are never sent; a character split over several byte-level tokens is held back, not garbled."""

from __future__ import annotations

import pytest

from longctx.serve.detok import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer()


def _feed(tok, text, stop=None):
    d = IncrementalDetokenizer(tok, stop)
    parts = []
    for t in tok.encode(text):
        parts.append(d.add(t))
        if d.stopped:
            break
    parts.append(d.flush())
    return "".join(parts), parts, d


def test_deltas_add_up_to_the_decode(tokenizer):
    text = "Hello, world! Ünïcödé 漢字 and emoji 🙂 too."
    got, parts, _ = _feed(tokenizer, text)
    assert got == tokenizer.decode(tokenizer.encode(text))
    assert not any("\ufffd" in p for p in parts)


def test_stop_string_spanning_tokens_is_cut_and_never_sent(tokenizer):
    got, parts, d = _feed(tokenizer, "one two three four five", stop=["ee fo"])
    assert d.stopped and got == "one two thr"
    assert "ee fo" not in "".join(parts)


def test_text_that_only_looks_like_a_stop_prefix_is_released(tokenizer):
    got, _, d = _feed(tokenizer, "the cat sat", stop=["sat on"])
    assert not d.stopped and got == "the cat sat"
