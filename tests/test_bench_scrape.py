"""`longctx.bench.scrape.MetricsWatch`: peaks of gauges and increases of counters over a watch, matched after
the namespace (ours `longctx:`, vLLM's `vllm:`), from scripted scrapes."""

from __future__ import annotations

import pytest

from longctx.bench import scrape


def test_peak_and_delta_over_scripted_scrapes(monkeypatch):
    seq = iter([{"vllm:num_requests_running": 0.0, "vllm:prefix_cache_hits_total": 10.0},
                {"vllm:num_requests_running": 3.0, "vllm:prefix_cache_hits_total": 40.0},
                {"vllm:num_requests_running": 1.0, "vllm:prefix_cache_hits_total": 90.0}])
    last = {}

    def fake(url):
        nonlocal last
        last = next(seq, last)
        return dict(last)

    monkeypatch.setattr(scrape, "read_metrics", fake)
    w = scrape.MetricsWatch("http://x")
    for _ in range(3):
        w.scrape()
    assert w.peak("num_requests_running") == 3.0
    assert w.delta("prefix_cache_hits_total") == 80.0
    with pytest.raises(KeyError, match="kv_cache"):
        w.peak("kv_cache_usage_perc")
    with pytest.raises(ValueError):
        scrape.MetricsWatch("http://x", every_s=0)


def test_the_watch_thread_starts_and_stops(monkeypatch):
    monkeypatch.setattr(scrape, "read_metrics", lambda url: {"longctx:num_requests_running": 2.0})
    with scrape.MetricsWatch("http://x", every_s=0.001) as w:
        pass
    assert w.num_scrapes >= 2 and w.peak("num_requests_running") == 2.0
