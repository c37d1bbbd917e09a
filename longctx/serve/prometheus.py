"""``GET /metrics``: the engine's state in Prometheus' text format (``prometheus_client``),
named as vLLM names it.

Read at scrape time from the engine (no second copy of any count). Every metric carries the label
``model_name``. Ours is the ``longctx:`` namespace, with vLLM's metric names after the colon (vLLM's own
are ``vllm:...``, SGLang's ``sglang:...``), so a dashboard or a PromQL query written for vLLM needs only
the prefix changed:

====================================  =======  =============================================================
metric                                type     meaning (and how it differs from vLLM's)
====================================  =======  =============================================================
``longctx:num_requests_running``      gauge    sequences holding KV blocks (the running queue), as vLLM
``longctx:num_requests_waiting``      gauge    requests accepted but not holding KV blocks: vLLM's waiting
                                               queue, plus those still on their way to the engine thread
``longctx:kv_cache_usage_perc``       gauge    used blocks / all blocks, a fraction in [0, 1] as vLLM's
                                               (cached blocks that no request holds count as free in both)
``longctx:kv_cache_used_blocks``      gauge    blocks held now (a shared prefix block counts once); ours:
``longctx:kv_cache_total_blocks``     gauge    blocks in the pool; vLLM reports only the fraction, and the
                                               total as the ``num_gpu_blocks`` label of ``cache_config_info``
``longctx:cache_config_info``         gauge=1  labels ``block_size``, ``cache_dtype`` ("auto": the model's
                                               dtype), ``enable_prefix_caching``, ``num_gpu_blocks``: the
                                               subset of vLLM's labels our engine has (the pool may be in CPU
                                               memory; vLLM's label name is kept); ours add ``kv_press``
``longctx:prefix_cache_queries``      counter  tokens looked up in the prefix cache, as vLLM (each lookup of
                                               a waiting request with nothing computed, prompt + outputs)
``longctx:prefix_cache_hits``         counter  of those, tokens found cached (at most all but the last token)
``longctx:num_preemptions``           counter  preemptions by recompute, as vLLM's
``longctx:prompt_tokens``             counter  prompt length of each request when its first token appears
                                               (cached tokens included), as vLLM's
``longctx:generation_tokens``         counter  output tokens produced, as vLLM's
``longctx:kv_press_evicted_tokens``   counter  K/V entries per KV head a KV press evicted (no vLLM equivalent)
``longctx:kv_press_freed_blocks``     counter  blocks a KV press returned to the pool (no vLLM equivalent)
====================================  =======  =============================================================

Latency histograms, vLLM's names and buckets (v0.11), observed by the engine thread (``LatencyHistograms``,
the ``AsyncEngine``'s observer) on the engine's clock: ``longctx:time_to_first_token_seconds`` (arrival at the
engine to the first token), ``longctx:inter_token_latency_seconds`` (between consecutive tokens of a
request) and ``longctx:e2e_request_latency_seconds`` (arrival to the last token; a request a stop string ended
counts, one a client abandoned does not). They do not include HTTP or detokenization time: what a client sees
is measured by the benchmark client (``longctx.bench``). Counters appear with the ``_total`` suffix, as
prometheus_client writes them.

Why ``longctx:`` and not ``vllm:``: a dashboard must not mistake this engine for vLLM; the names after the
colon are vLLM's, so its queries need only the prefix changed.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "longctx:"
COUNTERS = (  # (metric name after the prefix, EngineCounters field, help text)
    ("prefix_cache_queries", "prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("num_preemptions", "num_preemptions",
     "Cumulative number of preemptions (by recompute) from the engine."),
    ("prompt_tokens", "num_prompt_tokens",
     "Number of prompt tokens of requests that produced a first token."),
    ("generation_tokens", "num_generation_tokens", "Number of generation tokens produced."),
    ("kv_press_evicted_tokens", "num_press_evicted_tokens",
     "K/V entries per KV head evicted by the KV press."),
    ("kv_press_freed_blocks", "num_press_freed_blocks", "KV blocks the KV press returned to the pool."),
)


class EngineCollector:
    """A prometheus_client collector over an ``AsyncEngine``: every value read when
    ``/metrics`` is scraped."""

    def __init__(self, aengine, model_name: str, cache_dtype: str = "auto", kv_press: str = "none") -> None:
        self.aengine, self.model_name = aengine, model_name
        self.cache_dtype, self.kv_press = cache_dtype, kv_press

    def _gauge(self, name: str, doc: str, value: float, **labels) -> GaugeMetricFamily:
        g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name", *labels])
        g.add_metric([self.model_name, *labels.values()], value)
        return g

    def collect(self):
        engine = self.aengine.engine
        bm, counters = engine.block_manager, engine.counters
        used = bm.num_used_blocks
        yield self._gauge("num_requests_running", "Number of requests holding KV cache blocks.",
                          len(engine.running))
        yield self._gauge("num_requests_waiting", "Number of requests waiting to be processed.",
                          self.aengine.num_waiting())
        yield self._gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          used / bm.num_blocks)
        yield self._gauge("kv_cache_used_blocks", "KV cache blocks held by requests.", used)
        yield self._gauge("kv_cache_total_blocks", "KV cache blocks in the pool.", bm.num_blocks)
        yield self._gauge("cache_config_info", "Information of the KV cache configuration.", 1,
                          block_size=str(bm.block_size), cache_dtype=self.cache_dtype,
                          enable_prefix_caching=str(bm.enable_prefix_caching),
                          num_gpu_blocks=str(bm.num_blocks), kv_press=self.kv_press)
        for name, field, doc in COUNTERS:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric([self.model_name], getattr(counters, field))
            yield c


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class LatencyHistograms:
    """TTFT, inter-token and end-to-end latency histograms (an ``AsyncEngine`` observer)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        def hist(name: str, doc: str, buckets: tuple[float, ...]):
            return Histogram(PREFIX + name, doc, ["model_name"], registry=registry,
                             buckets=buckets).labels(model_name)

        self._ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                          TTFT_BUCKETS)
        self._itl = hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         ITL_BUCKETS)
        self._e2e = hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                         E2E_BUCKETS)

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def finished(self, seconds: float) -> None:
        self._e2e.observe(seconds)


def metrics_registry(collector: EngineCollector) -> tuple[CollectorRegistry, LatencyHistograms]:
    """A registry of its own (not prometheus_client's global one: several servers in one process never clash)
    with the engine's collector and the latency histograms."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry, LatencyHistograms(registry, collector.model_name)


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The body and content type of ``GET /metrics``."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, parsed with prometheus_client's text parser (values of one name summed over
    label sets; counters keep their ``_total`` name; ``_created`` timestamps are left out)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def read_metrics(base_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """``GET {base_url}/metrics`` of any Prometheus-speaking server (ours, vLLM's), parsed by
    ``parse_metrics``."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
        return parse_metrics(r.read().decode("utf-8"))
