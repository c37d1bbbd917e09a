"""The decode stall as a client sees it (lesson 08): ``StallScenario.requests`` sent to a server.

Chat users stream long answers; ``long_at_s`` seconds later the long prompts arrive. On a monolithic server
every chat stream freezes for the whole prefill (one gap as long as the prefill); on a chunked-prefill server
the prefill rides along with the decodes in budget-sized pieces (many slightly slower gaps instead).
"""

from __future__ import annotations

from longctx.bench.client import run_benchmark
from longctx.bench.client_metrics import summarize
from longctx.lessons.stall import StallScenario
from longctx.request_metrics import SLO, RequestMetrics


def run_stall(base_url: str, model: str, tokenizer, slos: SLO | None = None,
              scenario: StallScenario | None = None, **request_options) -> dict:
    """Send ``scenario.requests(tokenizer, **request_options)`` to the server; returns plain data (times in s
    from the first send).

    Keys: ``chat`` / ``long`` (summaries of each class, as ``bench.client_metrics.summarize``), ``chat_gaps``
    (``[(time_s, gap_s)]`` of every chat chunk after the first), ``long_sent_s``, ``long_first_token_s``
    (None if it failed), and per completed chat user ``chat_worst_gap_s``, ``chat_ttft_s``, ``chat_good``
    (met ``slos``); ``chat_itl_s`` pools every chat gap. Chunks are timed by vLLM's rule
    (``longctx.request_metrics``).
    """
    requests, offsets = (scenario or StallScenario(4, 1024)).requests(tokenizer, **request_options)
    records, duration_s = run_benchmark(base_url, model, requests, offsets_s=offsets)
    t0 = min(r.start_s for r in records)
    chat = [r for r in records if r.kind == "chat"]
    long_ = [r for r in records if r.kind == "long-prefill"]
    gaps, worst, ttft, good = [], [], [], []
    for r in chat:
        if r.ok:
            lat = RequestMetrics.from_timestamps(r.start_s, r.token_times_s, end_s=r.end_s,
                                                 num_output_tokens=r.output_tokens)
            gaps += [(t - t0, g) for t, g in zip(r.token_times_s[1:], lat.itl_s, strict=True)]
            worst.append(max(lat.itl_s, default=0.0))
            ttft.append(lat.ttft_s)
            good.append(bool((slos or SLO()).met_by(lat)))
    return {
        "chat": summarize(chat, duration_s, slos),
        "long": summarize(long_, duration_s, slos) if long_ else None,
        "chat_gaps": sorted(gaps),
        "chat_worst_gap_s": worst,
        "chat_ttft_s": ttft,
        "chat_itl_s": [g for _, g in gaps],
        "chat_good": good,
        "long_sent_s": [r.start_s - t0 for r in long_],
        "long_first_token_s": [(r.token_times_s[0] - t0) if r.ok else None for r in long_],
        "errors": [r.error for r in records if not r.ok],
    }
