"""longctx.evals.depth_probe: each depth-1 variant changes one thing and keeps the trial's needle, filler and
chat template (the special tokens survive the re-tokenization)."""

from __future__ import annotations

import pytest

from longctx.evals.depth_probe import VARIANTS, depth_one_variants
from longctx.evals.haystack import HaystackBuilder


@pytest.fixture(scope="module")
def variants(smollm2_tokenizer):
    return smollm2_tokenizer, depth_one_variants(HaystackBuilder(smollm2_tokenizer), 512, 7)


def test_every_variant_keeps_the_needle_where_it_says(variants):
    tok, v = variants
    assert list(v) == list(VARIANTS)
    base = v["depth 1"]
    needle = base.token_ids[base.needle_start : base.needle_start + base.needle_len]
    for name, p in v.items():
        assert p.answer == base.answer, name
        assert p.token_ids[p.needle_start : p.needle_start + p.needle_len - 1] == needle[:-1], name
        text = tok.decode(p.token_ids, skip_special_tokens=False)
        assert text.count("<|im_start|>") == 3 and "<|im_end|>" in text, f"{name}: the chat template was lost"
        assert "What is the pass key?" in tok.decode(p.token_ids[p.question_start :]), name


def test_each_variant_changes_one_thing(variants):
    tok, v = variants
    base = v["depth 1"]
    end = base.needle_start + base.needle_len
    assert base.question_start == end  # depth 1: the question follows the needle at once
    moved = v["32 filler tokens between"]
    assert len(moved.token_ids) == len(base.token_ids) and moved.needle_start == base.needle_start - 32
    assert sorted(moved.token_ids) == sorted(base.token_ids)  # the same tokens, 32 of them moved
    clean = v["filler ends a sentence"]
    assert tok.decode(clean.token_ids[: clean.needle_start]).endswith(".")
    assert clean.token_ids[clean.needle_start :] == base.token_ids[base.needle_start :]
    assert v["no answer prefix"].token_ids[: end] == base.token_ids[: end]
    assert tok.decode(v["no answer prefix"].token_ids, skip_special_tokens=False).endswith("assistant\n")
    assert " What is the pass key?" in tok.decode(v["no blank lines"].token_ids)
    assert v["junction re-tokenized"].token_ids != base.token_ids
    assert tok.decode(v["junction re-tokenized"].token_ids) == tok.decode(base.token_ids)  # same text
