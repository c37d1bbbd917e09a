"""``GET /metrics``: the engine's state in Prometheus' text format (``prometheus_client``),
under vLLM's names (v0.11's ``vllm/v1/metrics/loggers.py``).

Gauges and counters are read at scrape time from the engine (no second copy of any count). Every series
carries vLLM's labels ``model_name`` (the served name) and ``engine`` ("0": one engine core). The namespace
is vLLM's ``vllm:`` by default (``create_app(metrics_prefix=...)`` to change it), so vLLM's Grafana
dashboards and alerts read this server unchanged:

==========================================  =======  ======================================================
metric                                      type     meaning (and how it differs from vLLM's)
==========================================  =======  ======================================================
``vllm:num_requests_running``               gauge    sequences holding KV blocks (the running queue)
``vllm:num_requests_waiting``               gauge    requests accepted but not holding KV blocks: vLLM's
                                                     waiting queue, plus those on their way to the engine
``vllm:kv_cache_usage_perc``                gauge    used blocks / all blocks, in [0, 1] (cached blocks no
                                                     request holds count as free, as in vLLM)
``vllm:kv_cache_used_blocks``               gauge    ours: blocks held now (a shared block counts once)
``vllm:kv_cache_total_blocks``              gauge    ours: blocks in the pool (vLLM: ``num_gpu_blocks``)
``vllm:cache_config_info``                  gauge=1  labels ``block_size``, ``cache_dtype``,
                                                     ``enable_prefix_caching``, ``num_gpu_blocks`` (the pool
                                                     may be in CPU memory; vLLM's name kept); ours add
                                                     ``kv_press``
``vllm:prefix_cache_queries``               counter  tokens looked up in the prefix cache
``vllm:prefix_cache_hits``                  counter  of those, tokens found cached
``vllm:num_preemptions``                    counter  preemptions by recompute
``vllm:prompt_tokens``                      counter  prompt tokens of requests that produced a first token
``vllm:generation_tokens``                  counter  output tokens produced
``vllm:request_success``                    counter  finished requests by ``finished_reason``: stop, length,
                                                     abort (a client that left)
``vllm:kv_press_evicted_tokens``            counter  ours: K/V entries per KV head a KV press evicted
``vllm:kv_press_freed_blocks``              counter  ours: blocks a KV press returned to the pool
``vllm:time_to_first_token_seconds``        hist.    arrival at the engine to the first token
``vllm:inter_token_latency_seconds``        hist.    between consecutive tokens of a request
``vllm:request_time_per_output_token_secon  hist.    per request: (last token - first token) / (tokens - 1)
ds``
``vllm:e2e_request_latency_seconds``        hist.    arrival to the last token
``vllm:request_queue_time_seconds``         hist.    arrival to first scheduled (WAITING)
``vllm:request_inference_time_seconds``     hist.    first scheduled to the last token (RUNNING)
``vllm:request_prefill_time_seconds``       hist.    first scheduled to the first token
``vllm:request_decode_time_seconds``        hist.    first token to the last token
``vllm:request_prompt_tokens``              hist.    prompt tokens per finished request (1-2-5 buckets up
                                                     to max_model_len, as vLLM)
``vllm:request_generation_tokens``          hist.    output tokens per finished request
``vllm:request_params_max_tokens``          hist.    max_tokens per finished request
``vllm:iteration_tokens_total``             hist.    tokens computed per engine step (prefill + decode)
==========================================  =======  ======================================================

The per-request series (``RequestObserver``, the ``AsyncEngine``'s observer) are observed by the engine
thread on the engine's clock, with vLLM's buckets; a request a stop string ended counts as finished
("stop"), one a client abandoned counts only in ``request_success`` ("abort"). They do not include HTTP or
detokenization time: what a client sees is measured by the benchmark client (``longctx.bench``). Counters
appear with the ``_total`` suffix, as prometheus_client writes them. Not here (no equivalent in this
engine): vLLM's LoRA, multimodal cache, speculative decoding and KV-connector series, ``request_params_n``
and ``request_max_num_generation_tokens``.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "vllm:"
ENGINE = "0"  # vLLM's ``engine`` label: one engine core
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

    def __init__(self, aengine, model_name: str, cache_dtype: str = "auto", kv_press: str = "none",
                 prefix: str = PREFIX) -> None:
        self.aengine, self.model_name, self.prefix = aengine, model_name, prefix
        self.cache_dtype, self.kv_press = cache_dtype, kv_press

    def _gauge(self, name: str, doc: str, value: float, **labels) -> GaugeMetricFamily:
        g = GaugeMetricFamily(self.prefix + name, doc, labels=["model_name", "engine", *labels])
        g.add_metric([self.model_name, ENGINE, *labels.values()], value)
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
            c = CounterMetricFamily(self.prefix + name, doc, labels=["model_name", "engine"])
            c.add_metric([self.model_name, ENGINE], getattr(counters, field))
            yield c


TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


def _125_buckets(largest: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``largest`` (vLLM's ``build_1_2_5_buckets`` for token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > largest:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class RequestObserver:
    """The per-request and per-step series vLLM observes (an ``AsyncEngine`` observer): latency histograms
    on the engine's clock, token-count histograms, finished requests by reason, tokens per step."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int,
                 prefix: str = PREFIX) -> None:
        labels = {"model_name": model_name, "engine": ENGINE}

        def hist(name: str, doc: str, buckets):
            return Histogram(prefix + name, doc, list(labels), registry=registry,
                             buckets=buckets).labels(**labels)

        tokens = _125_buckets(max_model_len)
        self._ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                          TTFT_BUCKETS)
        self._itl = hist("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                         ITL_BUCKETS)
        self._tpot = hist("request_time_per_output_token_seconds",
                          "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self._e2e = hist("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                         E2E_BUCKETS)
        self._phases = {phase: hist(f"request_{phase}_time_seconds", doc, E2E_BUCKETS) for phase, doc in (
            ("queue", "Histogram of time spent in WAITING phase for request."),
            ("inference", "Histogram of time spent in RUNNING phase for request."),
            ("prefill", "Histogram of time spent in PREFILL phase for request."),
            ("decode", "Histogram of time spent in DECODE phase for request."))}
        self._prompt = hist("request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self._generation = hist("request_generation_tokens", "Number of generation tokens processed.", tokens)
        self._max_tokens = hist("request_params_max_tokens", "Histogram of the max_tokens request parameter.",
                                tokens)
        self._step = hist("iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                          ITERATION_BUCKETS)
        self._success = Counter(prefix + "request_success", "Count of successfully processed requests.",
                                [*labels, "finished_reason"], registry=registry)
        self._labels = labels

    def first_token(self, seconds: float) -> None:
        self._ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def step(self, num_tokens: int) -> None:
        self._step.observe(num_tokens)

    def finished(self, seq, reason: str, end_s: float) -> None:
        """A request that ended (``reason``: stop, length, or abort for a client that left: vLLM counts it,
        but its latencies are no request's answer and are left out)."""
        self._success.labels(**self._labels, finished_reason=reason).inc()
        if reason == "abort":
            return
        times, n_out = seq.token_times_s, len(seq.output_token_ids)
        self._e2e.observe(end_s - seq.arrival_s)
        self._prompt.observe(len(seq.prompt_token_ids))
        self._generation.observe(n_out)
        self._max_tokens.observe(seq.max_tokens)
        scheduled = seq.first_scheduled_s if seq.first_scheduled_s is not None else seq.arrival_s
        self._phases["queue"].observe(scheduled - seq.arrival_s)
        self._phases["inference"].observe(end_s - scheduled)
        if times:
            self._phases["prefill"].observe(times[0] - scheduled)
            self._phases["decode"].observe(end_s - times[0])
            if n_out > 1:
                self._tpot.observe((times[-1] - times[0]) / (n_out - 1))


def metrics_registry(collector: EngineCollector, max_model_len: int) -> tuple[CollectorRegistry,
                                                                              RequestObserver]:
    """A registry of its own (not prometheus_client's global one: several servers in one process never clash)
    with the engine's collector and the per-request series."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry, RequestObserver(registry, collector.model_name, max_model_len, collector.prefix)


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
