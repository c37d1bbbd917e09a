"""Ready-made simulator experiments used by the lessons and ``benchmarks/``.

- ``sweep_rates`` / ``capacity``: Sarathi-Serve's capacity experiment (Agrawal et al., OSDI 2024, §5):
  the highest request rate whose P99 inter-token latency stays under an SLO while the median scheduling
  delay stays under 2 s (so the queue does not grow without bound).
- ``load_recorded``: results of ``benchmarks/capacity.py`` stored in ``longctx/data/recorded/``
  (``longctx.recorded.load_recorded``, re-exported).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler, Scheduler
from longctx.recorded import load_recorded
from longctx.sim.cost_model import CostFactors
from longctx.sim.run import simulate
from longctx.sim.workload import LogNormal, make_workload

# ---- capacity (Sarathi-Serve) -----------------------------------------------------------------------------

# A long-prompt workload, kept under Llama-3-8B's 8K context (assumed shape, not a recorded dataset).
CAPACITY_PROMPT = LogNormal(median=2048, sigma=0.8, low=64, high=7168)
CAPACITY_OUTPUT = LogNormal(median=256, sigma=0.8, low=8, high=1024)
MAX_MEDIAN_SCHEDULING_DELAY_S = 2.0  # Sarathi-Serve's bound on queueing at "capacity"


# vLLM V0 without chunked prefill batches whole prompts up to max(max_model_len, 2048) tokens per step.
MONOLITHIC_MAX_BATCHED_TOKENS = 8192


def default_schedulers(budgets: Sequence[int] = (512, 1024, 2048)) -> dict[str, Callable[[], Scheduler]]:
    """``monolithic`` (at most 8,192 batched prompt tokens, as vLLM V0) and ``chunked-<budget>``."""
    out: dict[str, Callable[[], Scheduler]] = {
        "monolithic": lambda: MonolithicScheduler(max_num_batched_tokens=MONOLITHIC_MAX_BATCHED_TOKENS)
    }
    for b in budgets:
        out[f"chunked-{b}"] = lambda b=b: ChunkedPrefillScheduler(token_budget=b)
    return out


@dataclass(frozen=True)
class RatePoint:
    """One simulated load: P99 ITL and median scheduling delay at ``rate_qps``."""

    rate_qps: float
    p99_itl_s: float
    p50_ttft_s: float
    p50_scheduling_delay_s: float
    throughput_tok_s: float

    def meets(self, slo_p99_itl_s: float, max_delay_s: float = MAX_MEDIAN_SCHEDULING_DELAY_S) -> bool:
        return self.p99_itl_s <= slo_p99_itl_s and self.p50_scheduling_delay_s <= max_delay_s


def run_rate(
    scheduler_factory: Callable[[], Scheduler], rate_qps: float, model: str = "llama-3-8b",
    hardware: str = "h100", num_requests: int = 300, prompt_tokens=CAPACITY_PROMPT,
    output_tokens=CAPACITY_OUTPUT, seed: int = 0, factors: CostFactors | None = None,
) -> RatePoint:
    """Simulate one load. The same seed gives the same requests, arrivals scaled by 1/rate."""
    wl = make_workload(num_requests, rate_qps, prompt_tokens, output_tokens, seed=seed)
    r = simulate(wl, scheduler_factory(), model, hardware, factors)
    m = r.metrics
    return RatePoint(float(rate_qps), m.itl.p(99), m.ttft.median, float(np.median(r.scheduling_delay_s)),
                     m.output_throughput)


def sweep_rates(
    scheduler_factory: Callable[[], Scheduler], rates_qps: Sequence[float], **kwargs
) -> list[RatePoint]:
    """``run_rate`` at each rate (for a P99-ITL-versus-load curve)."""
    return [run_rate(scheduler_factory, r, **kwargs) for r in rates_qps]


def p99_itl_curve(
    rates_qps: Sequence[float] = (1, 2, 4, 8, 16),
    schedulers: dict[str, Callable[[], Scheduler]] | None = None, num_requests: int = 150, **kwargs,
) -> dict[str, list[RatePoint]]:
    """Lesson 02's live curve: P99 ITL (and scheduling delay) versus load for each scheduler.

    Small by default (150 requests per load, about a second per point on one core); the full experiment
    is ``benchmarks/capacity.py`` (its results: ``load_recorded()``).
    """
    schedulers = schedulers or {k: v for k, v in default_schedulers((512,)).items()}
    return {name: sweep_rates(f, rates_qps, num_requests=num_requests, **kwargs)
            for name, f in schedulers.items()}


def capacity(
    scheduler_factory: Callable[[], Scheduler], slo_p99_itl_s: float, low_qps: float = 0.25,
    high_qps: float = 64.0, iterations: int = 9, max_delay_s: float = MAX_MEDIAN_SCHEDULING_DELAY_S,
    cache: dict[float, RatePoint] | None = None, **kwargs,
) -> float:
    """Highest rate (QPS) meeting the SLO: double from ``low_qps`` to the first failing rate, then bisect
    on a log scale ``iterations`` times between the last passing and the first failing rate.

    Returns 0.0 if even ``low_qps`` fails, ``high_qps`` if that passes. ``cache`` (rate -> RatePoint)
    lets several SLOs share the simulated loads of one scheduler.
    """
    cache = {} if cache is None else cache

    def ok(rate: float) -> bool:
        if rate not in cache:
            cache[rate] = run_rate(scheduler_factory, rate, **kwargs)
        return cache[rate].meets(slo_p99_itl_s, max_delay_s)

    if not ok(low_qps):
        return 0.0
    lo = low_qps  # scan up by doublings to the first failure (a short run can pass again when overloaded)
    while True:
        hi = min(2 * lo, high_qps)
        if not ok(hi):
            break
        if hi >= high_qps:
            return high_qps
        lo = hi
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def capacity_table(
    models: Sequence[str] = ("llama-3-8b", "mistral-7b"), slos_s: Sequence[float] = (0.1, 0.5),
    schedulers: dict[str, Callable[[], Scheduler]] | None = None, hardware: str = "h100", **kwargs,
) -> list[dict]:
    """Rows ``{model, gpu, scheduler, slo_p99_itl_s, capacity_qps}`` for every combination."""
    schedulers = schedulers or default_schedulers()
    rows = []
    for model in models:
        caches: dict[str, dict] = {name: {} for name in schedulers}
        for slo in slos_s:
            for name, factory in schedulers.items():
                cap = capacity(factory, slo, model=model, hardware=hardware, cache=caches[name], **kwargs)
                rows.append({"model": model, "gpu": hardware, "scheduler": name, "slo_p99_itl_s": slo,
                             "capacity_qps": cap})
    return rows


__all__ = ["RatePoint", "capacity", "capacity_table", "default_schedulers", "load_recorded", "p99_itl_curve",
           "run_rate", "sweep_rates"]
