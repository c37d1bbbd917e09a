"""`longctx.bench` times chunks by vLLM's rule (every chunk with choices, text or not), and can also time the
text-carrying chunks only: the two summaries differ exactly where empty chunks arrive."""

from __future__ import annotations

import pytest

from longctx.bench.client_metrics import RequestRecord, summarize


def _rec(i, times, has_text, n, error=None):
    return RequestRecord(i, 0.0, list(times), times[-1] if times else None, n, 10, "x", error, 200, None,
                         "", list(has_text))


def test_choices_rule_counts_empty_chunks_and_text_rule_skips_them():
    # a held-back character (empty chunk at 0.3), then the EOS chunk and a finish-only chunk
    recs = [_rec(0, [0.1, 0.2, 0.3, 0.5, 0.6, 0.6001], [True, True, False, True, False, False], 5)]
    vllm = summarize(recs, 1.0)
    text = summarize(recs, 1.0, chunks="text")
    assert vllm["chunks_timed"] == "choices" and text["chunks_timed"] == "text"
    assert vllm["itl_ms"]["n"] == 5 and text["itl_ms"]["n"] == 2
    assert text["itl_ms"]["mean"] == pytest.approx(200.0)  # gaps 100 and 300 ms: the held-back one merged
    assert vllm["itl_ms"]["p99"] < 200.0
    assert vllm["ttft_ms"]["median"] == text["ttft_ms"]["median"] == pytest.approx(100.0)
    assert vllm["e2e_ms"]["median"] == text["e2e_ms"]["median"]  # E2E is the last chunk with choices in both


def test_a_request_with_only_empty_chunks_succeeds_as_in_vllm():
    recs = [_rec(0, [0.4, 0.5], [False, False], 2)]
    assert recs[0].ok
    assert summarize(recs, 1.0)["completed"] == 1
    text = summarize(recs, 1.0, chunks="text")
    assert text["completed"] == 1 and text["ttft_ms"]["n"] == 0  # completed, but no text to time


def test_records_without_flags_are_all_text():
    rec = RequestRecord(0, 0.0, [0.1, 0.2], 0.2, 2)
    assert rec.text_times_s == [0.1, 0.2]
    with pytest.raises(ValueError, match="chunks"):
        summarize([rec], 1.0, chunks="tokens")


def test_the_table_gives_checked_answers_an_interval():
    from longctx.bench.client_metrics import format_table

    rec = RequestRecord(0, 0.0, [0.1, 0.2], 0.2, 2, 10, "it is 42", None, 200, "42")
    table = format_table(summarize([rec], 1.0))
    assert "1 / 1 (95 % Wilson interval 0.21 to 1.00)" in table
