"""Serving metrics from per-token timestamps, as vLLM's ``benchmark_serving.py`` defines them.

Per request (times in seconds):
- TTFT  = first token time - arrival time
- ITL   = the gaps between consecutive output tokens (a list, ``outputs - 1`` long)
- TPOT  = (E2E - TTFT) / (outputs - 1), undefined for a single output token
- E2E   = last token time - arrival time

Over a run of ``duration_s`` (default: last finish minus first arrival):
- request throughput = completed / duration; output throughput = output tokens / duration;
  total token throughput = (prompt + output tokens) / duration
- goodput = requests meeting every SLO given (TTFT, TPOT, E2E upper bounds) / duration
  (DistServe's definition, as in vLLM's ``--goodput``)
- ITL percentiles pool the gaps of all requests; TTFT / TPOT / E2E percentiles pool one value per request.
Percentiles use numpy's default linear interpolation, like vLLM. Pure Python + numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


@dataclass(frozen=True)
class RequestMetrics:
    """Latencies of one finished request, in seconds."""

    request_id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    ttft_s: float
    itl_s: tuple[float, ...]
    tpot_s: float | None
    e2e_s: float

    @classmethod
    def from_timestamps(
        cls, arrival_s: float, token_times_s: Sequence[float], num_prompt_tokens: int = 0, request_id: int = 0
    ) -> RequestMetrics:
        """Build from the arrival time and the time of each output token (at least one)."""
        t = [float(x) for x in token_times_s]
        if not t:
            raise ValueError("a request needs at least one output token time")
        if any(b < a for a, b in zip(t, t[1:], strict=False)):
            raise ValueError("token times must be non-decreasing")
        ttft_s, e2e_s = t[0] - arrival_s, t[-1] - arrival_s
        itl_s = tuple(b - a for a, b in zip(t, t[1:], strict=False))
        tpot_s = (e2e_s - ttft_s) / (len(t) - 1) if len(t) > 1 else None
        return cls(request_id, float(arrival_s), int(num_prompt_tokens), len(t), ttft_s, itl_s, tpot_s, e2e_s)


def request_metrics(seq) -> RequestMetrics:
    """Metrics of a finished ``Sequence`` (anything with ``arrival_s``, ``token_times_s``,
    ``num_prompt_tokens`` and ``seq_id``)."""
    return RequestMetrics.from_timestamps(
        seq.arrival_s, seq.token_times_s, seq.num_prompt_tokens, getattr(seq, "seq_id", 0)
    )


@dataclass(frozen=True)
class SLO:
    """Upper bounds a request must meet to count toward goodput (None: no bound)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, r: RequestMetrics) -> bool:
        if self.ttft_s is not None and r.ttft_s > self.ttft_s:
            return False
        if self.tpot_s is not None and r.tpot_s is not None and r.tpot_s > self.tpot_s:
            return False
        return self.e2e_s is None or r.e2e_s <= self.e2e_s


@dataclass(frozen=True)
class Distribution:
    """Summary statistics of a list of values (seconds)."""

    count: int
    mean: float
    std: float
    min: float
    max: float
    percentiles: dict[float, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Iterable[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> Distribution:
        v = np.asarray(list(values), dtype=float)
        if v.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, {float(p): nan for p in percentiles})
        pct = {float(p): float(np.percentile(v, p)) for p in percentiles}
        return cls(int(v.size), float(v.mean()), float(v.std()), float(v.min()), float(v.max()), pct)

    @property
    def median(self) -> float:
        return self.percentiles.get(50.0, float("nan"))

    def p(self, q: float) -> float:
        """The q-th percentile (must be one of those computed)."""
        return self.percentiles[float(q)]


@dataclass(frozen=True)
class RunMetrics:
    """Aggregate metrics of a run (throughputs per second; latencies as ``Distribution`` in seconds)."""

    completed: int
    duration_s: float
    total_prompt_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    goodput: float | None
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation (numpy's default, as vLLM)."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        raise ValueError("percentile of an empty list")
    return float(np.percentile(v, q))


def summarize(
    requests: Iterable,
    duration_s: float | None = None,
    slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> RunMetrics:
    """Aggregate metrics of finished requests (``RequestMetrics`` or finished ``Sequence`` objects)."""
    rs = [r if isinstance(r, RequestMetrics) else request_metrics(r) for r in requests]
    if not rs:
        raise ValueError("no finished requests to summarize")
    if duration_s is None:
        duration_s = max(r.arrival_s + r.e2e_s for r in rs) - min(r.arrival_s for r in rs)
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    n_prompt = sum(r.num_prompt_tokens for r in rs)
    n_out = sum(r.num_output_tokens for r in rs)
    return RunMetrics(
        completed=len(rs),
        duration_s=float(duration_s),
        total_prompt_tokens=n_prompt,
        total_output_tokens=n_out,
        request_throughput=len(rs) / duration_s,
        output_throughput=n_out / duration_s,
        total_token_throughput=(n_prompt + n_out) / duration_s,
        goodput=None if slo is None else sum(slo.met_by(r) for r in rs) / duration_s,
        ttft=Distribution.of((r.ttft_s for r in rs), percentiles),
        tpot=Distribution.of((r.tpot_s for r in rs if r.tpot_s is not None), percentiles),
        itl=Distribution.of((g for r in rs for g in r.itl_s), percentiles),
        e2e=Distribution.of((r.e2e_s for r in rs), percentiles),
    )
