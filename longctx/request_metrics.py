"""Serving metrics, the one definition: the engine, the simulator and the benchmark client all use it.

Definitions are vLLM's (``benchmark_serving.py``, now ``vllm bench serve``). Per request, times in seconds
from its arrival (the engine's clock) or its send (a client's clock), both called ``arrival_s`` here:

- TTFT  = first token time - arrival time
- ITL   = the gaps between consecutive token times (a list, one shorter than the times)
- E2E   = end - arrival time, where end is the last token time (or a later end the caller saw: a client's
  last chunk)
- TPOT  = (E2E - TTFT) / (output tokens - 1), undefined (None) for a single output token; output tokens
  are one per token time unless the caller knows better (a server's ``usage.completion_tokens``)

Over a run of ``duration_s`` (default: last finish minus first arrival):
- request throughput = completed / duration; output throughput = output tokens / duration;
  total token throughput = (prompt + output tokens) / duration
- goodput = requests meeting every bound of an ``SLO`` / duration (DistServe's definition, as in vLLM's
  ``--goodput``; we add an ITL bound vLLM does not have: the request's *worst* gap must be under it)
- ITL statistics pool the gaps of all requests; TTFT / TPOT / E2E statistics pool one value per request.
A ``Distribution`` summarises values in seconds or milliseconds (``unit``); it is NaN when empty, and
``to_dict`` renders it as plain data (the benchmark's ``n / mean / median / std / p50 ...`` in ms with
vLLM's zeros for no values, or the simulator's ``p50 ... mean`` in s with None). Percentiles use numpy's
default linear interpolation, like vLLM. Pure Python + numpy (no engine, no torch).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
UNITS = {"s": 1.0, "ms": 1000.0}  # a Distribution's unit -> factor from seconds


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
        cls, arrival_s: float, token_times_s: Sequence[float], num_prompt_tokens: int = 0,
        request_id: int = 0, end_s: float | None = None, num_output_tokens: int | None = None,
    ) -> RequestMetrics:
        """Build from the arrival (or send) time and the time of each output token (at least one).

        ``end_s``: when the request ended, if after its last token time (a client's last chunk; default:
        the last token time). ``num_output_tokens``: tokens generated, for TPOT (default: one per time)."""
        t = [float(x) for x in token_times_s]
        if not t:
            raise ValueError("a request needs at least one token time (a failed request has no latencies)")
        itl_s = tuple(map(operator.sub, t[1:], t[:-1]))  # b - a for consecutive (a, b)
        if (itl_s and min(itl_s) < 0) or t[0] < arrival_s:
            raise ValueError("token times must be non-decreasing and not before the arrival (send) time")
        end = t[-1] if end_s is None else max(float(end_s), t[-1])
        n = len(t) if num_output_tokens is None else int(num_output_tokens)
        if n < 1:
            raise ValueError(
                f"num_output_tokens must be >= 1 for a request with tokens, got {num_output_tokens}"
            )
        ttft_s, e2e_s = t[0] - arrival_s, end - arrival_s
        tpot_s = (e2e_s - ttft_s) / (n - 1) if n > 1 else None
        return cls(request_id, float(arrival_s), int(num_prompt_tokens), n, ttft_s, itl_s, tpot_s, e2e_s)


def request_metrics(seq) -> RequestMetrics:
    """Metrics of a finished ``Sequence`` (anything with ``arrival_s``, ``token_times_s``,
    ``num_prompt_tokens`` and ``seq_id``)."""
    return RequestMetrics.from_timestamps(
        seq.arrival_s, seq.token_times_s, seq.num_prompt_tokens, getattr(seq, "seq_id", 0)
    )


@dataclass(frozen=True)
class SLO:
    """Upper bounds (seconds) a request must meet to count toward goodput (None: no bound). ``itl_s`` bounds
    the request's worst gap (a user sees a stall once, not on average); TPOT is not checked for a one-token
    answer, which has none (vLLM counts it as 0)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_s: float | None = None
    e2e_s: float | None = None

    def met_by(self, r: RequestMetrics) -> bool:
        """Whether every given bound holds (a value equal to its bound meets it)."""
        checks = (
            (self.ttft_s, r.ttft_s), (self.tpot_s, r.tpot_s), (self.itl_s, max(r.itl_s, default=0.0)),
            (self.e2e_s, r.e2e_s),
        )
        return not any(bound is not None and value is not None and value > bound for bound, value in checks)


@dataclass(frozen=True)
class Distribution:
    """Summary statistics of a list of values, in ``unit`` (``"s"`` or ``"ms"``); NaN when there are none.
    ``median`` is the 50th percentile (linear interpolation, as the others)."""

    count: int
    mean: float
    median: float
    std: float
    min: float
    max: float
    percentiles: dict[float, float] = field(default_factory=dict)
    unit: str = "s"

    @classmethod
    def of(
        cls, values_s: Iterable[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES, unit: str = "s"
    ) -> Distribution:
        """Statistics of ``values_s`` (seconds), computed in ``unit`` (the values are scaled first)."""
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        v = np.asarray(list(values_s), dtype=float) * UNITS[unit]  # x * 1.0 is exactly x
        if v.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan, {float(p): nan for p in percentiles}, unit)
        pct = {float(p): float(np.percentile(v, p)) for p in percentiles}
        median = pct[50.0] if 50.0 in pct else float(np.percentile(v, 50.0))
        return cls(
            int(v.size), float(v.mean()), median, float(v.std()), float(v.min()), float(v.max()), pct, unit
        )

    def p(self, q: float) -> float:
        """The q-th percentile (must be one of those computed)."""
        return self.percentiles[float(q)]

    def to_dict(self, keys: Sequence[str] | None = None, empty: float | None = None) -> dict:
        """Plain data in this distribution's unit: ``n``, ``mean``, ``median``, ``std`` and ``p<q>`` for each
        percentile (the benchmark's layout), or just ``keys`` (any of those, ``min`` and ``max``) in that
        order. NaN values (no values at all) become ``empty``: 0.0 as vLLM prints them, None for JSON null."""
        row = {"n": self.count, "mean": self.mean, "median": self.median, "std": self.std, "min": self.min,
               "max": self.max, **{f"p{q:g}": v for q, v in self.percentiles.items()}}
        keys = keys or ("n", "mean", "median", "std", *(f"p{q:g}" for q in self.percentiles))
        return {k: empty if isinstance(row[k], float) and math.isnan(row[k]) else row[k] for k in keys}


@dataclass(frozen=True)
class RunMetrics:
    """Aggregate metrics of a run (throughputs per second; latencies as ``Distribution`` in ``unit``)."""

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
    num_good: int | None = None  # requests that met the SLO (None: no SLO given)

    @classmethod
    def of(
        cls, requests: Sequence[RequestMetrics], duration_s: float, slo: SLO | None = None,
        percentiles: Sequence[float] = DEFAULT_PERCENTILES, unit: str = "s",
    ) -> RunMetrics:
        """The aggregate of ``requests`` over ``duration_s`` as given (NaN rates for NaN; no checks: see
        ``summarize``). The benchmark client calls it for the requests that have latencies."""
        rs = list(requests)
        n_prompt = sum(r.num_prompt_tokens for r in rs)
        n_out = sum(r.num_output_tokens for r in rs)
        good = None if slo is None else sum(slo.met_by(r) for r in rs)
        return cls(
            completed=len(rs), duration_s=float(duration_s), total_prompt_tokens=n_prompt,
            total_output_tokens=n_out, request_throughput=len(rs) / duration_s,
            output_throughput=n_out / duration_s, total_token_throughput=(n_prompt + n_out) / duration_s,
            goodput=None if good is None else good / duration_s,
            ttft=Distribution.of((r.ttft_s for r in rs), percentiles, unit),
            tpot=Distribution.of((r.tpot_s for r in rs if r.tpot_s is not None), percentiles, unit),
            itl=Distribution.of((g for r in rs for g in r.itl_s), percentiles, unit),
            e2e=Distribution.of((r.e2e_s for r in rs), percentiles, unit), num_good=good,
        )


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation (numpy's default, as vLLM)."""
    v = np.asarray(list(values), dtype=float)
    if v.size == 0:
        raise ValueError("percentile of an empty list")
    return float(np.percentile(v, q))


def summarize(
    requests: Iterable, duration_s: float | None = None, slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES, unit: str = "s",
) -> RunMetrics:
    """Aggregate metrics of finished requests (``RequestMetrics`` or finished ``Sequence`` objects); raises
    ``ValueError`` when there are none or the duration is not positive."""
    rs = [r if isinstance(r, RequestMetrics) else request_metrics(r) for r in requests]
    if not rs:
        raise ValueError("no finished requests to summarize")
    if duration_s is None:
        duration_s = max(r.arrival_s + r.e2e_s for r in rs) - min(r.arrival_s for r in rs)
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    return RunMetrics.of(rs, duration_s, slo, percentiles, unit)
