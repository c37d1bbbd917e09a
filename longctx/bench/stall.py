"""The decode stall as a client sees it: chat users streaming while a long prompt arrives.

``num_chat`` users start chatting (long answers, streamed); ``long_at_s`` seconds later ``num_long`` requests
with ``long_prompt_tokens``-token prompts arrive. On a monolithic (prefill-first) server every chat stream
freezes for the whole prefill: one inter-token gap as long as the prefill. On a chunked-prefill server the
prefill is cut into ``token_budget``-sized pieces that ride along with the decodes: many slightly slower gaps
instead of one freeze. ``run_stall`` returns plain data (times in seconds from the first send).
"""

from __future__ import annotations

from longctx.bench.client import run_benchmark
from longctx.bench.metrics import summarize
from longctx.bench.workloads import build_workload, count_chat_tokens
from longctx.metrics import SLO, RequestMetrics

STORY_TOPICS = (
    "a lighthouse keeper",
    "a lost map",
    "two rival bakers",
    "a clockmaker's apprentice",
    "a storm at sea",
    "a mountain village",
    "a travelling circus",
    "an old library",
)


def stall_requests(
    tokenizer,
    num_chat: int = 4,
    chat_max_tokens: int = 48,
    num_long: int = 1,
    long_prompt_tokens: int = 1024,
    long_max_tokens: int = 4,
    long_at_s: float = 1.0,
    seed: int = 0,
) -> tuple[list[dict], list[float]]:
    """(requests, send offsets in s): chat users at ~0 s, long prompts at ``long_at_s``."""
    if num_chat < 1 or num_long < 0:
        raise ValueError(f"need num_chat >= 1 and num_long >= 0, got {num_chat}, {num_long}")
    chats = []
    for i in range(num_chat):
        content = f"Tell me a long story about {STORY_TOPICS[(seed + i) % len(STORY_TOPICS)]}."
        chats.append(
            {
                "messages": [{"role": "user", "content": content}],
                "max_tokens": chat_max_tokens,
                "kind": "chat",
                "prompt_tokens": count_chat_tokens(tokenizer, content),
            }
        )
    longs = (
        build_workload("long-prefill", num_long, tokenizer, long_prompt_tokens, long_max_tokens, seed)
        if num_long
        else []
    )
    offsets = [0.02 * i for i in range(num_chat)] + [long_at_s + 0.02 * i for i in range(num_long)]
    return chats + longs, offsets


def run_stall(base_url: str, model: str, tokenizer, slos: SLO | None = None, **kwargs) -> dict:
    """Run the scenario against a server; returns plain data.

    Keys: ``chat`` / ``long`` (summaries of each class, as ``metrics.summarize``), ``chat_gaps``
    (``[(time_s, gap_s)]`` of every chat chunk after the first, time from the first send), ``long_sent_s``,
    ``long_first_token_s`` (None if it failed), and per completed chat user ``chat_worst_gap_s``,
    ``chat_ttft_s``, ``chat_good`` (met ``slos``); ``chat_itl_s`` pools every chat gap. Chunks are timed by
    vLLM's rule (``metrics``).
    """
    requests, offsets = stall_requests(tokenizer, **kwargs)
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
