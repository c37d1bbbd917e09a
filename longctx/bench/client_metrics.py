"""Serving metrics from what a *client* sees: the time each streamed token arrived.

Definitions are vLLM's (``vllm bench serve``: ``vllm/benchmarks/serve.py`` and
``vllm/benchmarks/lib/endpoint_request_func.py``; formerly ``benchmarks/benchmark_serving.py`` and
``backend_request_func.py``), per request, times in seconds from the moment the request was sent
(``start_s``). A *chunk* is a streamed event with a non-empty ``choices`` list, whatever its text (empty for
a held-back character, an EOS token, or a final chunk with only ``finish_reason``):

- TTFT = arrival of the first chunk - start
- ITL  = gaps between consecutive chunks (a list; a one-chunk answer has none)
- E2E  = arrival of the last chunk - start
- TPOT = (E2E - TTFT) / (output_tokens - 1); undefined (None) for one output token (vLLM then leaves it out
  of the TPOT statistics and uses 0 when it checks a TPOT SLO)
- output_tokens = the server's ``usage.completion_tokens`` when it sends usage (as vLLM), else the number of
  chunks (vLLM then counts the text's tokens with the model's tokenizer; our server always sends usage).

Over a run of ``duration_s`` (first send to last response): request throughput = completed / duration, output
throughput = output tokens / duration, goodput = requests that completed AND met every SLO / duration
(DistServe's definition, vLLM's ``--goodput ttft:… tpot:… e2el:…``). We add an ITL SLO that vLLM does not
have: a request meets it when its *worst* gap is under the bound (a user sees a stall once, not on average).
Failed requests are counted and listed, never dropped; they never count toward goodput. (Where we differ from
vLLM's client: an error event inside a 200 stream fails the request here; vLLM skips it.)

A server that sends its ``finish_reason`` in a chunk of its own (ours does) adds one near-zero gap per request
to the ITL list under this rule; ``RequestRecord.text_times_s`` gives the text-only timeline (``summarize(...,
chunks="text")``) so the difference can be measured rather than guessed.
The definitions (per-request latencies, the SLO, the distributions and the run aggregate) are
``longctx.request_metrics``', the ones the engine and the simulator use; this module adds what only a client
has (``RequestRecord``, failures, answer checks, the table) and renders the summary in milliseconds.
Percentiles are numpy's linear interpolation (``np.percentile``), as vLLM prints them; the median is the
50th of them. Pure Python + numpy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from longctx.request_metrics import DEFAULT_PERCENTILES, SLO, RequestMetrics, RunMetrics


@dataclass
class RequestRecord:
    """One request as the client saw it (plain data; times on the client's ``perf_counter`` clock)."""

    request_id: int
    start_s: float
    # arrival of each chunk with choices (vLLM's rule)
    token_times_s: list[float] = field(default_factory=list)
    end_s: float | None = None  # arrival of the last chunk with choices
    output_tokens: int | None = None  # server usage (or a tokenizer count)
    prompt_tokens: int | None = None
    text: str = ""
    error: str | None = None  # None: success
    status: int | None = None  # HTTP status
    expected: str | None = None  # the right answer, when the workload knows it
    kind: str = ""  # workload class (e.g. "chat", "long-prefill")
    chunk_has_text: list[bool] = field(default_factory=list)  # per timed chunk: did it carry text?

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times_s)

    @property
    def text_times_s(self) -> list[float]:
        """Arrival of the chunks that carried text (a client that times text only; not vLLM's rule)."""
        flags = self.chunk_has_text or [True] * len(self.token_times_s)
        return [t for t, has in zip(self.token_times_s, flags, strict=True) if has]

    @property
    def correct(self) -> bool | None:
        if self.expected is None or not self.ok:
            return None
        return self.expected in self.text

    def to_dict(self) -> dict:
        return asdict(self)


def request_latencies(
    start_s: float, token_times_s, end_s: float | None = None, output_tokens: int | None = None
) -> dict:
    """TTFT, ITL, TPOT and E2E of one request from raw timestamps (seconds):
    ``longctx.request_metrics.RequestMetrics``
    as a plain dict.

    ``token_times_s``: arrival time of each text-carrying chunk (at least one). ``end_s``: arrival of the
    final chunk (default: the last token). ``output_tokens``: tokens generated (default: one per chunk).
    Returns ``{"ttft_s", "itl_s" (list), "tpot_s" (None for one token), "e2e_s", "output_tokens"}``.
    """
    r = RequestMetrics.from_timestamps(start_s, token_times_s, end_s=end_s, num_output_tokens=output_tokens)
    return {"ttft_s": r.ttft_s, "itl_s": list(r.itl_s), "tpot_s": r.tpot_s, "e2e_s": r.e2e_s,
            "output_tokens": r.num_output_tokens}


# the benchmark's name for longctx.request_metrics.SLO (lesson 08, the CLI and benchmarks/serving.py use it)
SLOs = SLO


def summarize(
    records: list[RequestRecord], duration_s: float | None = None, slos: SLO | None = None,
    percentiles=DEFAULT_PERCENTILES, chunks: str = "choices",
) -> dict:
    """Benchmark summary (plain data, JSON-ready) of a run's records: ``longctx.request_metrics.RunMetrics``
    of the completed requests in milliseconds, plus the failures, the answer checks and the SLOs.

    ``chunks``: which arrivals are timed: ``"choices"`` (every chunk with choices: vLLM's rule, the default)
    or ``"text"`` (only chunks that carried text; a completed request without any has no latencies then).
    """
    if chunks not in ("choices", "text"):
        raise ValueError(f"chunks must be 'choices' (vLLM's rule) or 'text', got {chunks!r}")
    slos = slos or SLO()
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    if duration_s is None:
        ends = [r.end_s or (r.token_times_s[-1] if r.token_times_s else r.start_s) for r in records]
        duration_s = (max(ends) - min(r.start_s for r in records)) if records else 0.0
    timed = [(r, r.token_times_s if chunks == "choices" else r.text_times_s) for r in done]
    lats = [
        RequestMetrics.from_timestamps(
            r.start_s, t, r.prompt_tokens or 0, r.request_id, r.end_s, r.output_tokens
        )
        for r, t in timed
        if t
    ]
    in_tokens = sum(r.prompt_tokens or 0 for r in done)
    checked = [r.correct for r in done if r.correct is not None]
    dur = float(duration_s) if duration_s and duration_s > 0 else float("nan")
    m = RunMetrics.of(lats, dur, slos, percentiles, unit="ms")
    return {
        "num_requests": len(records),
        "completed": len(done),
        "failed": len(failed),
        "errors": dict(Counter((r.error or "no tokens received")[:200] for r in failed)),
        "duration_s": float(duration_s),
        "total_input_tokens": in_tokens,
        "total_output_tokens": m.total_output_tokens,
        "request_throughput": len(done) / dur,
        "output_throughput": m.output_throughput,
        "total_token_throughput": (in_tokens + m.total_output_tokens) / dur,
        "slos_ms": {k: (None if v is None else v * 1000.0) for k, v in asdict(slos).items()},
        "chunks_timed": chunks,
        "num_good": m.num_good,
        "goodput": m.goodput,
        "answers_checked": len(checked),
        "answers_correct": sum(bool(c) for c in checked),
        "ttft_ms": m.ttft.to_dict(empty=0.0),  # vLLM prints 0 for no values
        "tpot_ms": m.tpot.to_dict(empty=0.0),
        "itl_ms": m.itl.to_dict(empty=0.0),
        "e2e_ms": m.e2e.to_dict(empty=0.0),
    }


def format_table(summary: dict) -> str:
    """The summary as a text table (vLLM's layout, plus errors, goodput and answer checks)."""
    s = summary
    lines = [
        "{:=^60}".format(" Serving Benchmark Result "),
        f"{'Requests: completed / failed / total':<42} "
        f"{s['completed']} / {s['failed']} / {s['num_requests']}",
    ]
    for msg, count in s["errors"].items():
        lines.append(f"  error x{count}: {msg}")
    lines += [
        f"{'Benchmark duration (s):':<42} {s['duration_s']:.2f}",
        f"{'Total input tokens:':<42} {s['total_input_tokens']}",
        f"{'Total generated tokens:':<42} {s['total_output_tokens']}",
        f"{'Request throughput (req/s):':<42} {s['request_throughput']:.3f}",
        f"{'Output token throughput (tok/s):':<42} {s['output_throughput']:.2f}",
        f"{'Total token throughput (tok/s):':<42} {s['total_token_throughput']:.2f}",
    ]
    slos = {k: v for k, v in s["slos_ms"].items() if v is not None}
    if slos:
        desc = ", ".join(f"{k.removesuffix('_s')}<={v:g}ms" for k, v in slos.items())
        lines.append(f"{'Goodput (req/s) under ' + desc + ':':<42} {s['goodput']:.3f} ({s['num_good']} good)")
    if s["answers_checked"]:
        from longctx.evals.stats import wilson_interval

        lo, hi = wilson_interval(s["answers_correct"], s["answers_checked"])
        lines.append(f"{'Answers correct:':<42} {s['answers_correct']} / {s['answers_checked']} "
                     f"(95 % Wilson interval {lo:.2f} to {hi:.2f})")
    pct = [k for k in s["ttft_ms"] if k.startswith("p")]
    lines.append(f"{'(ms)':<8}" + "".join(f"{h:>10}" for h in ["n", "mean", "median", *pct]))
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        d = s[name]
        row = [d["n"], d["mean"], d["median"], *[d[k] for k in pct]]
        lines.append(
            f"{name.removesuffix('_ms').upper():<8}"
            + f"{row[0]:>10}"
            + "".join(f"{x:>10.1f}" for x in row[1:])
        )
    lines.append("=" * 60)
    return "\n".join(lines)
