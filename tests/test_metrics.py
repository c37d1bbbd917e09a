"""Metrics on hand-worked timestamps (vLLM benchmark_serving definitions)."""

import math

import pytest

from longctx.request_metrics import SLO, Distribution, RequestMetrics, percentile, summarize


def test_request_metrics_by_hand():
    r = RequestMetrics.from_timestamps(
        arrival_s=1.0, token_times_s=[1.5, 1.7, 2.0, 2.5], num_prompt_tokens=10
    )
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_s == pytest.approx((0.2, 0.3, 0.5))
    assert r.e2e_s == pytest.approx(1.5)
    assert r.tpot_s == pytest.approx((1.5 - 0.5) / 3)
    single = RequestMetrics.from_timestamps(0.0, [0.3])
    assert single.tpot_s is None and single.itl_s == ()
    with pytest.raises(ValueError):
        RequestMetrics.from_timestamps(0.0, [])
    with pytest.raises(ValueError):
        RequestMetrics.from_timestamps(0.0, [1.0, 0.5])


def test_percentile_linear_interpolation():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([0, 10], 99) == pytest.approx(9.9)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_throughput_and_goodput():
    a = RequestMetrics.from_timestamps(0.0, [1.0, 2.0, 3.0], num_prompt_tokens=5, request_id=0)
    b = RequestMetrics.from_timestamps(1.0, [1.5, 1.6], num_prompt_tokens=3, request_id=1)
    m = summarize([a, b], slo=SLO(ttft_s=0.6))
    assert m.duration_s == pytest.approx(3.0)  # first arrival 0, last token 3
    assert m.completed == 2 and m.total_output_tokens == 5 and m.total_prompt_tokens == 8
    assert m.output_throughput == pytest.approx(5 / 3)
    assert m.total_token_throughput == pytest.approx(13 / 3)
    assert m.goodput == pytest.approx(1 / 3)  # only b has TTFT <= 0.6
    assert m.itl.count == 3 and m.itl.max == pytest.approx(1.0)
    assert m.ttft.median == pytest.approx(0.75)
    assert m.tpot.mean == pytest.approx((1.0 + 0.1) / 2)
    assert summarize([a, b], slo=SLO(tpot_s=0.5)).goodput == pytest.approx(1 / 3)
    assert summarize([a, b]).goodput is None


def test_empty_distribution_is_nan():
    d = Distribution.of([])
    assert d.count == 0 and math.isnan(d.median)
