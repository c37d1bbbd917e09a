"""`longctx bench` metrics: hand-worked numbers, and the streaming client on a scripted fake stream whose
chunks arrive at known times (a fake clock drives the client's perf_counter)."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from longctx.bench import client as bench_client
from longctx.bench.client import arrival_offsets_s, stream_request
from longctx.bench.client_metrics import RequestRecord, SLOs, format_table, request_latencies, summarize


def test_request_latencies_hand_worked():
    lat = request_latencies(10.0, [10.5, 10.6, 10.8, 11.1], end_s=11.1, output_tokens=4)
    assert lat["ttft_s"] == pytest.approx(0.5)
    assert lat["itl_s"] == pytest.approx([0.1, 0.2, 0.3])
    assert lat["e2e_s"] == pytest.approx(1.1)
    assert lat["tpot_s"] == pytest.approx(0.6 / 3)


def test_one_token_answer_has_no_itl_and_no_tpot():
    lat = request_latencies(0.0, [0.25], end_s=0.3, output_tokens=1)
    assert lat["itl_s"] == [] and lat["tpot_s"] is None
    assert lat["ttft_s"] == pytest.approx(0.25) and lat["e2e_s"] == pytest.approx(0.3)


def test_usage_count_beats_chunk_count_for_tpot():
    # 3 text chunks, but the server says 4 tokens (the EOS that ended it has no text): TPOT uses 4
    lat = request_latencies(0.0, [1.0, 1.1, 1.2], end_s=1.3, output_tokens=4)
    assert lat["tpot_s"] == pytest.approx(0.3 / 3)


def test_bad_timestamps_raise():
    with pytest.raises(ValueError, match="at least one token"):
        request_latencies(0.0, [])
    with pytest.raises(ValueError, match="non-decreasing"):
        request_latencies(0.0, [1.0, 0.5])


def _rec(i, start, times, n=None, error=None, expected=None, text=""):
    return RequestRecord(
        i, start, list(times), times[-1] if times else None, n or len(times), 10, text, error,
        200 if error is None else 503, expected,
    )


def test_summarize_counts_errors_and_goodput():
    recs = [
        _rec(0, 0.0, [0.1, 0.2, 0.3]),  # ttft 0.1, worst gap 0.1
        _rec(1, 0.0, [0.5, 0.6, 1.6]),  # ttft 0.5, worst gap 1.0 (a stall)
        _rec(2, 0.0, [0.2]),  # one token
        _rec(3, 0.0, [], error="HTTP 503: overloaded"),
        _rec(4, 0.0, [0.3, 0.4], expected="42", text="it is 42"),
    ]
    s = summarize(recs, duration_s=2.0, slos=SLOs(ttft_s=0.4, itl_s=0.5))
    assert (s["completed"], s["failed"]) == (4, 1)
    assert s["errors"] == {"HTTP 503: overloaded": 1}
    assert s["num_good"] == 3  # request 1 misses both SLOs; the failure never counts
    assert s["goodput"] == pytest.approx(1.5)
    assert s["request_throughput"] == pytest.approx(2.0)
    assert s["total_output_tokens"] == 3 + 3 + 1 + 2
    assert s["itl_ms"]["n"] == 2 + 2 + 0 + 1  # gaps pooled over requests
    assert s["ttft_ms"]["median"] == pytest.approx(250.0)  # median of 100, 500, 200, 300
    assert s["answers_checked"] == 1 and s["answers_correct"] == 1
    table = format_table(s)
    assert "4 / 1 / 5" in table and "HTTP 503" in table


def test_poisson_arrivals_are_seeded_and_have_the_right_rate():
    a, b = arrival_offsets_s(2000, 10.0, seed=3), arrival_offsets_s(2000, 10.0, seed=3)
    assert a == b and a[0] == 0.0
    assert a[-1] / 1999 == pytest.approx(0.1, rel=0.1)
    assert arrival_offsets_s(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_offsets_s(3, 0.0)


# ---- the client on a scripted stream ----
class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _sse_lines(events):
    return [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]


def _chunk(text, finish=None):
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def _run_scripted(monkeypatch, script, status=200, body=b""):
    """script: list of (arrival_time_s, sse_bytes). Returns the RequestRecord."""
    clock = FakeClock()
    monkeypatch.setattr(bench_client.time, "perf_counter", clock)

    async def stream():
        for t, line in script:
            clock.t = t
            yield line

    def handler(request):
        if status != 200:
            return httpx.Response(status, content=body)
        return httpx.Response(200, content=stream(), headers={"content-type": "text/event-stream"})

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            req = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "expected": "blue"}
            return await stream_request(c, "http://fake", "m", req)

    return asyncio.run(go())


def test_client_times_a_scripted_stream(monkeypatch):
    lines = _sse_lines(
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            _chunk("The"), _chunk(" sky"), _chunk(" is"), _chunk(" blue"), _chunk("", "stop"),
            {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}},
        ]
    )
    times = [0.05, 0.40, 0.45, 0.55, 1.25, 1.30, 1.31, 1.32]
    rec = _run_scripted(monkeypatch, list(zip(times, lines, strict=True)))
    assert rec.ok and rec.text == "The sky is blue" and rec.correct is True
    # vLLM's rule: every chunk with choices is timed, the role-only and the finish-only ones included
    assert rec.token_times_s == pytest.approx([0.05, 0.40, 0.45, 0.55, 1.25, 1.30])
    assert rec.chunk_has_text == [False, True, True, True, True, False]
    assert rec.text_times_s == pytest.approx([0.40, 0.45, 0.55, 1.25])
    assert rec.output_tokens == 5 and rec.prompt_tokens == 9
    lat = request_latencies(rec.start_s, rec.token_times_s, rec.end_s, rec.output_tokens)
    assert lat["ttft_s"] == pytest.approx(0.05)
    assert lat["itl_s"] == pytest.approx([0.35, 0.05, 0.10, 0.70, 0.05])
    assert lat["e2e_s"] == pytest.approx(1.30)  # the finish chunk; the usage chunk has no choices
    assert lat["tpot_s"] == pytest.approx((1.30 - 0.05) / 4)
    text = request_latencies(rec.start_s, rec.text_times_s, rec.end_s, rec.output_tokens)
    assert text["ttft_s"] == pytest.approx(0.40) and text["itl_s"] == pytest.approx([0.05, 0.10, 0.70])


def test_client_records_http_errors_and_stream_errors(monkeypatch):
    err = json.dumps({"error": {"message": "too many", "type": "server_overloaded"}}).encode()
    rec = _run_scripted(monkeypatch, [], status=503, body=err)
    assert not rec.ok and rec.status == 503 and rec.error == "HTTP 503: too many"
    lines = _sse_lines([_chunk("a"), {"error": {"message": "engine failure"}}])
    rec = _run_scripted(monkeypatch, list(zip([0.1, 0.2, 0.3], lines, strict=True)))
    assert not rec.ok and "engine failure" in rec.error
    rec = _run_scripted(monkeypatch, [(0.1, b"data: [DONE]\n\n")])
    assert not rec.ok and "without a chunk with choices" in rec.error
