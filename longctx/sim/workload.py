"""Seeded workloads: when requests arrive and how long their prompts and outputs are.

Arrivals are ``longctx.arrivals.arrival_times`` (vLLM's ``benchmark_serving.py``): inter-arrival gaps are
gamma distributed with shape ``burstiness`` and mean ``1 / rate_qps`` (``burstiness = 1`` is a Poisson
process; < 1 is burstier, > 1 more regular), the first gap drawn too (``first_gap="draw"``: t[0] > 0).
``rate_qps = inf`` sends everything at t = 0. Lengths come from ``Fixed``, ``Uniform``,
``LogNormal`` or ``Trace`` (a list of recorded lengths, sampled with replacement or replayed in order).
Everything draws from one ``numpy.random.Generator(PCG64(seed))``: same seed, same workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from longctx.arrivals import arrival_times  # the one definition (re-exported: ``longctx.sim.arrival_times``)
from longctx.checks import positive_int


@dataclass(frozen=True)
class Request:
    """One request of a workload, the course's one request type: its arrival (s) and token counts. The
    simulator's workloads, lesson 02's toy workloads and lesson 03's allocation backlog are lists of them."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if not (self.prompt_tokens >= 1 and self.output_tokens >= 1):
            raise ValueError(
                f"a request needs prompt_tokens and output_tokens >= 1, got {self.prompt_tokens} "
                f"and {self.output_tokens}"
            )

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Fixed:
    """Every request has ``tokens`` tokens."""

    tokens: int

    def __post_init__(self) -> None:
        positive_int("Fixed.tokens", self.tokens)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, int(self.tokens), dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Uniform integers in ``[low, high]`` (both included)."""

    low: int
    high: int

    def __post_init__(self) -> None:
        positive_int("Uniform.low", self.low)
        positive_int("Uniform.high", self.high)
        if self.high < self.low:
            raise ValueError(f"Uniform needs low <= high, got {self.low} > {self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Log-normal lengths with the given ``median`` and ``sigma`` (of the log), clipped to ``[low, high]``."""

    median: float
    sigma: float = 1.0
    low: int = 1
    high: int = 1_000_000

    def __post_init__(self) -> None:
        if not self.median > 0 or not self.sigma >= 0:
            raise ValueError(f"LogNormal needs median > 0 and sigma >= 0, got {self.median}, {self.sigma}")
        positive_int("LogNormal.low", self.low)
        if self.high < self.low:
            raise ValueError(f"LogNormal needs low <= high, got {self.low} > {self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(math.log(self.median), self.sigma, size=n)
        return np.clip(np.rint(x), self.low, self.high).astype(np.int64)

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)  # before clipping


@dataclass(frozen=True)
class Trace:
    """Lengths from a recorded trace: sampled with replacement, or replayed in order (cycling)."""

    lengths: tuple[int, ...]
    replay: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(int(x) for x in self.lengths))
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError("Trace needs a non-empty list of positive lengths")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        arr = np.asarray(self.lengths, dtype=np.int64)
        if self.replay:
            return np.resize(arr, n)
        return rng.choice(arr, size=n, replace=True)


def _lengths(spec: int | Fixed | Uniform | LogNormal | Trace):
    return Fixed(int(spec)) if isinstance(spec, (int, np.integer)) else spec


def make_workload(
    num_requests: int, rate_qps: float, prompt_tokens: int | Fixed | Uniform | LogNormal | Trace,
    output_tokens: int | Fixed | Uniform | LogNormal | Trace, seed: int = 0, arrival: str = "poisson",
    burstiness: float = 1.0,
) -> list[Request]:
    """A seeded list of ``Request`` sorted by arrival.

    ``arrival``: ``"poisson"`` (exponential gaps) or ``"gamma"`` (shape ``burstiness``). Lengths: an int
    (fixed) or a length distribution.
    """
    if arrival not in ("poisson", "gamma"):
        raise ValueError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
    num_requests = positive_int("num_requests", num_requests)
    rng = np.random.Generator(np.random.PCG64(seed))
    burstiness = 1.0 if arrival == "poisson" else burstiness
    t = arrival_times(num_requests, rate_qps, rng, burstiness, first_gap="draw")  # t[0] > 0, as recorded
    p = _lengths(prompt_tokens).sample(rng, len(t))
    o = _lengths(output_tokens).sample(rng, len(t))
    return [Request(float(a), int(b), int(c)) for a, b, c in zip(t, p, o, strict=True)]
