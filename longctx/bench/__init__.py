"""A benchmark client for OpenAI-compatible servers (``python -m longctx bench``).

- ``metrics``: ``RequestRecord`` (what the client saw), ``request_latencies`` (TTFT/ITL/TPOT/E2E from raw
  timestamps), ``SLOs``, ``summarize`` (percentiles, throughput, goodput, errors, answer checks),
  ``format_table``.
- ``client``: ``run_requests`` / ``run_benchmark`` (streaming, Poisson or closed-loop arrivals).
- ``workloads``: ``build_workload("chat" | "needle" | "long-prefill" | "shared-prefix", n, tokenizer)``,
prompts sized in tokens.

No torch, no engine: the client only speaks HTTP.
"""
