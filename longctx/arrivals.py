"""Request arrival times: a Poisson process (or its gamma generalisation), the one definition.

Gaps between arrivals are gamma distributed with shape ``burstiness`` and mean ``1 / rate`` (vLLM's
``benchmark_serving.py``: ``burstiness = 1`` is a Poisson process, exponential gaps; < 1 is burstier, > 1
more regular). ``rate = inf`` sends everything at t = 0. The simulator's workloads
(``longctx.sim.workload``) and the benchmark client (``longctx.bench.client``) both draw from here.

The first gap is a convention, and the two callers differ, so it is an explicit argument:

- ``first_gap="draw"``: the first request also waits one drawn gap, so ``t[0] > 0``. The simulator uses it
  (its recorded results were drawn so).
- ``first_gap="zero"``: the same ``num_requests`` gaps are drawn, and the first is replaced by 0, so the
  first request goes at t = 0 (a benchmark does not idle before its first send). The others come at
  ``draw``'s times minus its first gap; the generator is left in the same state either way. The benchmark
  client uses it.

Pure numpy: no engine, no torch (the benchmark client imports it).
"""

from __future__ import annotations

import math

import numpy as np

from longctx.checks import as_integer

FIRST_GAPS = ("draw", "zero")


def arrival_times(
    num_requests: int, rate: float, rng: np.random.Generator, burstiness: float = 1.0, first_gap: str = "draw"
) -> np.ndarray:
    """Arrival times (s) of ``num_requests`` requests at ``rate`` per second (see the module docstring for
    ``burstiness`` and ``first_gap``). Draws ``num_requests`` gaps from ``rng`` (none when ``rate`` is
    inf)."""
    n = as_integer(num_requests, floats=True)
    if n is None or n < 0:
        raise ValueError(f"num_requests must be an integer >= 0, got {num_requests!r}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (or inf for all at once), got {rate!r}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (1 = Poisson), got {burstiness!r}")
    if first_gap not in FIRST_GAPS:
        raise ValueError(f"first_gap must be one of {FIRST_GAPS}, got {first_gap!r}")
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    if first_gap == "zero" and n:
        gaps[0] = 0.0
    return np.cumsum(gaps)
