"""A streaming benchmark client for any OpenAI-compatible server (ours, vLLM, SGLang, ...).

Each request is sent with ``"stream": true`` and ``stream_options.include_usage`` and timed chunk by chunk on
the client's ``time.perf_counter`` clock. Which chunks are timed is vLLM's rule (``vllm bench serve``,
``vllm/benchmarks/lib/endpoint_request_func.py``): every streamed event whose ``choices`` list is non-empty,
whether or not it carries text (a held-back multi-byte character, an EOS token, a final chunk that only
carries ``finish_reason``); the usage event (``choices: []``) is not. Each timed chunk also records whether
it carried text, so the text-only timeline can be compared (``RequestRecord.text_times_s``).

Failures: non-200 answers, broken connections and streams that end without a chunk with choices fail as in
vLLM; an error event inside a 200 stream (``{"error": ...}``) fails here too, where vLLM's client skips the
event and counts the request as a success. Failures are recorded with their message, never dropped. Arrivals:
a Poisson process at ``rate`` requests/s (seeded; ``inf``: all at once), optionally capped
at ``concurrency`` requests in flight (vLLM's ``--request-rate`` and ``--max-concurrency``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import numpy as np

from longctx.arrivals import arrival_times
from longctx.bench.client_metrics import RequestRecord

DEFAULT_TIMEOUT_S = 600.0


def _payload(req: dict, model: str) -> tuple[str, dict]:
    """(path, body) of a workload request: ``{"messages"| "prompt", "max_tokens", ...}``."""
    body = {
        "model": model, "max_tokens": int(req["max_tokens"]),
        "temperature": float(req.get("temperature", 0.0)), "stream": True,
        "stream_options": {"include_usage": True},
    }
    if req.get("ignore_eos"):
        body["ignore_eos"] = True  # vLLM's extension; other servers ignore unknown fields
    if "messages" in req:
        body["messages"] = req["messages"]
        return "/v1/chat/completions", body
    body["prompt"] = req["prompt"]
    return "/v1/completions", body


def _text_of(choice: dict) -> str:
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


async def stream_request(
    client: httpx.AsyncClient, base_url: str, model: str, req: dict, request_id: int = 0
) -> RequestRecord:
    """Send one workload request and record its timeline. Never raises for a server-side failure."""
    path, body = _payload(req, model)
    rec = RequestRecord(
        request_id, time.perf_counter(), expected=req.get("expected"), kind=req.get("kind", ""),
        prompt_tokens=req.get("prompt_tokens"),
    )
    try:
        async with client.stream("POST", base_url.rstrip("/") + path, json=body) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                raw = (await resp.aread()).decode("utf-8", "replace")
                try:
                    msg = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = raw[:200]
                rec.error = f"HTTP {resp.status_code}: {msg}"
                return rec
            parts = []
            async for line in resp.aiter_lines():
                line = line.strip()
                if not line.startswith("data:"):
                    continue  # blank lines, SSE comments / keep-alives
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    rec.error = f"stream error: {event['error'].get('message', event['error'])}"
                    break
                if event.get("choices"):  # vLLM's rule: a chunk with choices is timed, text or not
                    text = _text_of(event["choices"][0])
                    rec.token_times_s.append(now)
                    rec.chunk_has_text.append(bool(text))
                    parts.append(text)
                    rec.end_s = now
                if event.get("usage"):
                    rec.output_tokens = event["usage"].get("completion_tokens")
                    rec.prompt_tokens = event["usage"].get("prompt_tokens", rec.prompt_tokens)
            rec.text = "".join(parts)
            if rec.error is None and not rec.token_times_s:
                rec.error = "the stream ended without a chunk with choices"
    except (httpx.HTTPError, OSError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    return rec


def arrival_offsets_s(num_requests: int, rate: float, seed: int = 0) -> list[float]:
    """Send times (s from the start) of a Poisson process at ``rate`` req/s, the first at 0
    (``longctx.arrivals.arrival_times`` with ``first_gap="zero"``); all 0 for ``rate=inf``."""
    return arrival_times(num_requests, rate, np.random.default_rng(seed), first_gap="zero").tolist()


async def run_requests(
    base_url: str, model: str, requests: list[dict], rate: float = math.inf, concurrency: int | None = None,
    seed: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, offsets_s: list[float] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Run ``requests``; returns ``(records in request order, duration_s)``.

    ``offsets_s`` overrides the arrival times (seconds after the start) when given.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    offsets = offsets_s if offsets_s is not None else arrival_offsets_s(len(requests), rate, seed)
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        t0 = time.perf_counter()

        async def one(i: int, req: dict) -> RequestRecord:
            delay = t0 + offsets[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if gate is None:
                return await stream_request(client, base_url, model, req, i)
            async with gate:
                return await stream_request(client, base_url, model, req, i)

        records = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        duration_s = time.perf_counter() - t0
    return list(records), duration_s


def run_benchmark(
    base_url: str, model: str, requests: list[dict], **kwargs
) -> tuple[list[RequestRecord], float]:
    """Blocking wrapper of ``run_requests`` (works inside Jupyter, whose event loop is already running)."""
    coro = run_requests(base_url, model, requests, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
