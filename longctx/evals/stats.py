"""Uncertainty for the course's accuracies and comparisons: Wilson intervals, Fisher's exact test,
a bootstrap.

- ``wilson_interval(k, n)``: the 95 % score interval of a rate ``k / n`` (Wilson 1927). With ``z = 1.96``,
  ``p = k / n``: centre ``(p + z²/2n) / (1 + z²/n)``, half-width ``z sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)``.
  Unlike ``p ± z sqrt(p(1-p)/n)`` it stays inside [0, 1] and is not zero-width at 0/n or n/n.
- ``fisher_exact(k1, n1, k2, n2)``: the two-sided p-value that two rates differ, from the 2x2 table
  ``[[k1, n1-k1], [k2, n2-k2]]`` with both margins fixed (hypergeometric). Two-sided as R and SciPy do it: the
  sum of the probabilities of every table no more likely than the one observed (a relative tolerance of
  1e-7 counts ties as equal).
- ``bootstrap_diff(a, b)``: for continuous scores (answer log-probabilities, NLL): a percentile interval of
  ``mean(a) - mean(b)`` from resampling each group with replacement, and a two-sided bootstrap p-value
  (twice the smaller tail of the resampled differences around 0).

- ``mean_interval(values)``: the mean of a few independent measurements and its 95 % Student-t interval,
  ``mean ± t(0.975, n-1) s / sqrt(n)`` (for e.g. a simulator's error over repeated real runs).

- ``holm_adjusted(p_values)``: Holm's step-down adjustment for a family of ``m`` tests (Holm 1979): sorted
  ascending, the i-th smallest becomes ``max over j <= i of min(1, (m - j + 1) p_(j))``; a test survives the
  family at level alpha when its adjusted p-value is below alpha. Controls the family-wise error rate
  without assuming independence.
- ``noninferiority(k_new, n_new, k_ref, n_ref, margin)``: "no loss" only from a bound. The difference
  ``new - ref`` of two rates and its Newcombe hybrid score interval (Newcombe 1998, method 10: the two Wilson
  intervals combined, ``low = d - sqrt((p_new - l_new)^2 + (u_ref - p_ref)^2)``); the new rate is
  non-inferior when that lower bound lies above ``-margin``.

``Rate`` and ``compare_rates`` bundle these for tables: ``Rate.of([True, False, ...])`` is ``k``, ``n``,
the rate and its interval; ``compare_rates(a, b)`` says whether two rates differ at ``alpha``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

Z_95 = 1.959963984540054  # the 97.5 % quantile of the standard normal

# The 97.5 % quantiles of Student's t with 1 ... 30 degrees of freedom (any table); beyond 30, the normal's.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
          2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
          2.045, 2.042)


def mean_interval(values) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` (independent measurements, at least 2) and its 95 %
    Student-t interval."""
    x = np.asarray(list(values), dtype=float)
    if x.ndim != 1 or len(x) < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"mean_interval needs at least 2 finite numbers, got {len(x)} values")
    t = _T_975[len(x) - 2] if len(x) - 1 <= len(_T_975) else Z_95
    mean, half = float(x.mean()), t * float(x.std(ddof=1)) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def _counts(k, n) -> tuple[int, int]:
    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n:
        raise ValueError(f"k and n must be whole counts, got k={k!r}, n={n!r}")
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1 (k successes of n trials), got k={k}, n={n}")
    return k, n


def wilson_interval(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """``(low, high)`` of the Wilson score interval of ``k`` successes in ``n`` trials (95 % by default)."""
    k, n = _counts(k, n)
    if not z > 0:
        raise ValueError(f"z must be positive, got {z!r}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half), 1.0 if k == n else min(1.0, centre + half))


def _log_hypergeom(a: int, row1: int, row2: int, col1: int) -> float:
    """log P(a successes in row 1) with row sums ``row1``, ``row2`` and ``col1`` successes in all."""
    # fmt: off
    return (math.lgamma(row1 + 1) - math.lgamma(a + 1) - math.lgamma(row1 - a + 1)
            + math.lgamma(row2 + 1) - math.lgamma(col1 - a + 1) - math.lgamma(row2 - col1 + a + 1)
            - math.lgamma(row1 + row2 + 1) + math.lgamma(col1 + 1) + math.lgamma(row1 + row2 - col1 + 1))
    # fmt: on


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test: do ``k1 / n1`` and ``k2 / n2`` differ?"""
    k1, n1 = _counts(k1, n1)
    k2, n2 = _counts(k2, n2)
    col1 = k1 + k2
    lo, hi = max(0, col1 - n2), min(n1, col1)
    observed = _log_hypergeom(k1, n1, n2, col1)
    total = 0.0
    for a in range(lo, hi + 1):
        lp = _log_hypergeom(a, n1, n2, col1)
        if lp <= observed + 1e-7 * abs(observed) + 1e-12:
            total += math.exp(lp)
    return min(1.0, total)


def bootstrap_diff(a, b, num_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95) -> dict:
    """``{"diff", "low", "high", "p_value", "n_a", "n_b"}`` for ``mean(a) - mean(b)`` (percentile bootstrap).

    Each resample draws ``len(a)`` values of ``a`` and ``len(b)`` of ``b`` with replacement (independent
    groups); ``p_value`` is twice the smaller share of resampled differences on either side of 0 (at least
    ``1 / num_resamples``)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or len(a) < 2 or len(b) < 2:
        raise ValueError(f"need two 1-D groups of at least 2 values, got sizes {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the scores must be finite numbers")
    if not 0 < confidence < 1 or int(num_resamples) < 100:
        raise ValueError(f"need 0 < confidence < 1 and num_resamples >= 100, "
                         f"got {confidence}, {num_resamples}")
    rng = np.random.default_rng(seed)
    ra = a[rng.integers(0, len(a), size=(int(num_resamples), len(a)))].mean(axis=1)
    rb = b[rng.integers(0, len(b), size=(int(num_resamples), len(b)))].mean(axis=1)
    d = ra - rb
    tail = (1 - confidence) / 2
    low, high = np.quantile(d, [tail, 1 - tail])
    p = 2 * min((d <= 0).mean(), (d >= 0).mean())
    return {"diff": float(a.mean() - b.mean()), "low": float(low), "high": float(high),
            "p_value": float(min(1.0, max(p, 1 / int(num_resamples)))), "n_a": len(a), "n_b": len(b)}


@dataclass(frozen=True)
class Rate:
    """``k`` successes of ``n`` trials, the rate and its 95 % Wilson interval ``[low, high]``."""

    k: int
    n: int

    def __post_init__(self) -> None:
        _counts(self.k, self.n)

    @classmethod
    def of(cls, outcomes) -> Rate:
        """From booleans (or 0/1): ``Rate.of(r["correct"] for r in rows)``."""
        values = [bool(x) for x in outcomes]
        if not values:
            raise ValueError("no trials: a rate needs at least one outcome")
        return cls(sum(values), len(values))

    @property
    def rate(self) -> float:
        return self.k / self.n

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.k, self.n)

    def __str__(self) -> str:
        lo, hi = self.interval
        return f"{self.k}/{self.n} = {self.rate:.2f} [95 % CI {lo:.2f}, {hi:.2f}]"


def compare_rates(a: Rate, b: Rate, alpha: float = 0.05) -> dict:
    """``{"difference", "p_value", "significant"}``: Fisher's exact test of ``a.rate`` against ``b.rate``."""
    p = fisher_exact(a.k, a.n, b.k, b.n)
    return {"difference": a.rate - b.rate, "p_value": p, "significant": p < alpha}


def holm_adjusted(p_values) -> list[float]:
    """Holm-Bonferroni adjusted p-values of a family of tests, in the order given (monotone, at most 1)."""
    ps = [float(p) for p in p_values]
    if not ps:
        raise ValueError("holm_adjusted needs at least one p-value")
    if not all(0.0 <= p <= 1.0 for p in ps):  # also rejects NaN
        raise ValueError(f"p-values must lie in [0, 1], got {[p for p in ps if not 0.0 <= p <= 1.0]}")
    m = len(ps)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda j: ps[j])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class NonInferiority:
    """``new - ref`` of two rates, the lower end of its Newcombe (hybrid Wilson score) interval at
    ``confidence`` (two-sided, so a one-sided bound at ``1 - (1 - confidence) / 2``), the margin, and whether
    the lower bound clears ``-margin``."""

    difference: float
    lower_bound: float
    margin: float
    confidence: float
    noninferior: bool

    def describe(self) -> str:
        verdict = "non-inferior" if self.noninferior else "not shown non-inferior"
        side = ">" if self.noninferior else "<="
        return (f"difference {self.difference:+.2f}, {self.confidence:.0%} interval's lower end "
                f"{self.lower_bound:+.2f} {side} -{self.margin:.2f} (margin {self.margin:.2f}): {verdict}")


def noninferiority(k_new: int, n_new: int, k_ref: int, n_ref: int, margin: float,
                   confidence: float = 0.95) -> NonInferiority:
    """Is ``k_new / n_new`` no worse than ``k_ref / n_ref`` by more than ``margin`` (a rate, in (0, 1))?"""
    k_new, n_new = _counts(k_new, n_new)
    k_ref, n_ref = _counts(k_ref, n_ref)
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin is a difference of rates in (0, 1), e.g. 0.10; got {margin!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95; got {confidence!r}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p_new, p_ref = k_new / n_new, k_ref / n_ref
    l_new, _ = wilson_interval(k_new, n_new, z)
    _, u_ref = wilson_interval(k_ref, n_ref, z)
    diff = p_new - p_ref
    low = diff - math.sqrt((p_new - l_new) ** 2 + (u_ref - p_ref) ** 2)
    return NonInferiority(diff, low, float(margin), float(confidence), low > -margin)
