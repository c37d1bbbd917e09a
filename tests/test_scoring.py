"""Needle scoring by containment (longctx.evals.scoring): the rule, the greedy decoder that feeds it, and
every shipped needle record re-scored from its recorded output."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from model_fixtures import our_tokenizer

from longctx.evals.haystack import HaystackBuilder
from longctx.evals.niah import read_answer
from longctx.evals.scoring import SCORING, answer_closed, contains_answer, rescore_record
from longctx.recorded import recorded_path

# every recorded file whose rows are needle trials (lessons 05, 06 and 07 read them)
NEEDLE_RECORDS = (
    "niah_grid_passkey.json", "niah_grid_multikey.json", "niah_beyond.json", "kv_pruning_niah.json",
    "capstone_niah.json",
)


@pytest.mark.parametrize("output,hit", [
    ("11106", True), ('"11106".', True), ("11106. Remember it.", True), ("The pass key is 11106", True),
    ("is: 11106\n", True), ("1111. Remember it.", False), ("111060", False), ("211106", False),
    ("11 106", False), ("1110", False), ("", False), ("a magical number that", False),
])  # fmt: skip
def test_the_value_must_appear_as_a_whole_number(output, hit):
    assert contains_answer(output, "11106") is hit


def test_closed_means_no_further_token_can_change_the_verdict():
    assert answer_closed("11106.", "11106") and answer_closed('"11106"', "11106")
    assert not answer_closed("11106", "11106"), "a digit may still follow"
    assert not answer_closed("111065.", "11106")
    with pytest.raises(ValueError, match="string of digits"):
        contains_answer("x", "eleven")


def test_rescoring_moves_the_old_verdict_aside_and_is_idempotent():
    data = {"meta": {}, "rows": [{"answer": "1056549", "output": '"1056549".', "correct": False},
                                 {"answer": "1056549", "output": "1056549", "correct": True},
                                 {"answer": "52903", "output": "5293. Remember it.", "correct": False}]}
    assert rescore_record(data) == 1
    assert [r["correct"] for r in data["rows"]] == [True, True, False]
    assert [r["correct_exact"] for r in data["rows"]] == [False, True, False]
    assert data["meta"]["scoring"] == SCORING and data["meta"]["rescored"]["verdicts_changed"] == 1
    again = copy.deepcopy(data)
    assert rescore_record(again) == 0 and again == data
    with pytest.raises(ValueError, match="no 'answer'"):
        rescore_record({"rows": [{"output": "1", "correct": True}]})


@pytest.mark.parametrize("name", NEEDLE_RECORDS)
def test_every_shipped_needle_row_is_scored_by_containment(name):
    data = json.loads(recorded_path(name).read_text())
    assert data["meta"].get("scoring") == SCORING, f"{name} was not re-scored by containment"
    builder = HaystackBuilder(None)
    for row in data["rows"]:
        assert row["correct"] == contains_answer(row["output"], row["answer"]), row
        assert row["answer"] == builder.needle_value(row["seed"], row.get("haystack", "passkey"))
        assert row.get("usable", True), f"{name} holds a row recorded with --force"


def test_the_quoted_multikey_answers_now_count():
    rows = json.loads(recorded_path("niah_grid_multikey.json").read_text())["rows"]
    quoted = [r for r in rows if r["output"].startswith('"') and r["answer"] in r["output"]]
    assert len(quoted) >= 8 and all(r["correct"] and not r["exact"] for r in quoted)


def _forced_logits(tok, script, vocab):
    """Logits whose argmax at row i is ``script[i]`` (token ids)."""
    logits = torch.full((len(script), vocab), -10.0)
    for i, t in enumerate(script):
        logits[i, t] = 10.0
    return logits


def test_a_quoted_answer_is_decoded_to_the_end_and_scored_correct():
    tok = our_tokenizer()
    builder = HaystackBuilder(tok)
    prompt = builder.build(200, 0.5, seed=0)  # answer " 11106": [" ", "1", "1", "1", "0", "6"]
    quote = tok.encode(' "')
    said = quote + tok.encode("11106") + tok.encode('".') + [tok.eos_token_id]
    logits = _forced_logits(tok, said[: len(prompt.answer_ids)], tok.vocab_size)
    calls = []

    def next_token(token, k):  # the model's next greedy token after output token k
        calls.append(k)
        return said[k + 1]

    r = read_answer(logits, prompt, next_token, tok, len(prompt.answer_ids) + 16)
    assert r.output == '"11106".' and r.correct and not r.exact
    assert calls[0] == len(prompt.answer_ids) - 1 or calls[0] == 0
    assert len(r.token_logprobs) == len(prompt.answer_ids) and r.answer_logprob < -10


def test_a_right_answer_stops_once_the_number_is_closed_and_a_wrong_one_uses_the_budget():
    tok = our_tokenizer()
    prompt = HaystackBuilder(tok).build(200, 0.5, seed=0)
    ans = list(prompt.answer_ids)
    dot = tok.encode(".")[0]
    r = read_answer(_forced_logits(tok, ans, tok.vocab_size), prompt, lambda t, k: dot, tok, len(ans) + 16)
    assert r.correct and r.exact and r.output_ids == ans + [dot], "one token past the answer, then stop"
    assert r.breaks_at == -1
    wrong = ans[:3] + [ans[3] + 1] + ans[4:]
    r = read_answer(
        _forced_logits(tok, wrong, tok.vocab_size), prompt, lambda t, k: tok.encode(" and")[0], tok,
        len(ans) + 16,
    )
    assert not r.correct and len(r.output_ids) == len(ans) + 16 and r.forced_top[3] == ans[3] + 1
    assert r.breaks_at == 3, "the answer breaks at its fourth token"


def test_passkey_trials_read_different_filler_and_needle_values_match_the_builder():
    tok = our_tokenizer()
    builder = HaystackBuilder(tok)
    a, b = builder.build(400, 0.5, seed=1), builder.build(400, 0.5, seed=2)
    assert (
        a.token_ids[a.haystack_start : a.haystack_start + 30]
        != b.token_ids[b.haystack_start : b.haystack_start + 30]
    )
    for seed in range(5):
        for hay in ("passkey", "multikey"):
            assert builder.needle_value(seed, hay) == builder.build(300, 0.3, seed, hay).answer
