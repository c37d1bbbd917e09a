"""``GET /metrics``: the engine's state in Prometheus' text format (``prometheus_client``), named as vLLM names it.

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

vLLM's latency histograms (TTFT, ITL, e2e) are not exported: the benchmark client measures those as a client
sees them (``longctx.bench``). Counters appear with the ``_total`` suffix, as prometheus_client writes them.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "longctx:"
COUNTERS = (  # (metric name after the prefix, EngineCounters field, help text)
    ("prefix_cache_queries", "prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("num_preemptions", "num_preemptions", "Cumulative number of preemptions (by recompute) from the engine."),
    ("prompt_tokens", "num_prompt_tokens", "Number of prompt tokens of requests that produced a first token."),
    ("generation_tokens", "num_generation_tokens", "Number of generation tokens produced."),
    ("kv_press_evicted_tokens", "num_press_evicted_tokens", "K/V entries per KV head evicted by the KV press."),
    ("kv_press_freed_blocks", "num_press_freed_blocks", "KV blocks the KV press returned to the pool."),
)


class EngineCollector:
    """A prometheus_client collector over an ``AsyncEngine``: every value read when ``/metrics`` is scraped."""

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
        yield self._gauge("num_requests_running", "Number of requests holding KV cache blocks.", len(engine.running))
        yield self._gauge("num_requests_waiting", "Number of requests waiting to be processed.",
                          self.aengine.num_waiting())
        yield self._gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", used / bm.num_blocks)
        yield self._gauge("kv_cache_used_blocks", "KV cache blocks held by requests.", used)
        yield self._gauge("kv_cache_total_blocks", "KV cache blocks in the pool.", bm.num_blocks)
        yield self._gauge("cache_config_info", "Information of the KV cache configuration.", 1,
                          block_size=str(bm.block_size), cache_dtype=self.cache_dtype,
                          enable_prefix_caching=str(bm.enable_prefix_caching), num_gpu_blocks=str(bm.num_blocks),
                          kv_press=self.kv_press)
        for name, field, doc in COUNTERS:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric([self.model_name], getattr(counters, field))
            yield c


def metrics_registry(collector: EngineCollector) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one): several servers in one process never clash."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


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
    """``GET {base_url}/metrics`` of any Prometheus-speaking server (ours, vLLM's), parsed by ``parse_metrics``."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as r:
        return parse_metrics(r.read().decode("utf-8"))
