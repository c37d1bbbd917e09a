"""Uncertainty for the course's accuracies and comparisons: Wilson intervals, Fisher's exact test,
a bootstrap, and the paired tools (exact McNemar, a paired interval, a paired non-inferiority bound).

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

Paired trials (two methods answering the same prompts, a press and the full cache on the same seeds) are not
two independent samples: what carries the information is the trials on which the two *disagree*. ``Paired``
is their 2x2 table (``both``, ``only_a``, ``only_b``, ``neither``; ``Paired.of`` from two aligned lists of
outcomes, ``Paired.match`` from two lists of rows joined on a key):

- ``mcnemar_exact(only_a, only_b)``: the exact (conditional) McNemar test: under "no difference" each of the
  ``only_a + only_b`` discordant trials is equally likely to go either way, so
  ``only_a ~ Binomial(only_a + only_b, 1/2)``; two-sided ``p = min(1, 2 P(X <= min(only_a, only_b)))``, 1 when
  no trial is discordant. Concordant trials carry no information about the difference.
- ``paired_difference_interval(both, only_a, only_b, neither)``: the 95 % interval of ``rate_a - rate_b``
  from Newcombe's paired square-and-add method (Newcombe 1998, "Improved confidence intervals for the
  difference between binomial proportions based on paired data", Stat Med 17:2635-2650, method 10): the two
  marginal Wilson intervals combined as in the unpaired method, less twice their covariance through the
  continuity-corrected phi coefficient ``phi* = (ad - bc - n/2) / sqrt(r1 r2 c1 c2)`` when ``ad - bc > n/2``,
  0 when ``0 <= ad - bc <= n/2``, ``(ad - bc) / sqrt(...)`` when negative, 0 when a margin is empty:
  ``low = d - sqrt(da^2 - 2 phi* da eb + eb^2)`` with ``da = p_a - l_a``, ``eb = u_b - p_b`` (and the mirror
  image for ``high``). It agrees with McNemar: when the trials always agree it is narrow, however far
  from 0 or 1 the rates are.
- ``paired_noninferiority(table, margin)``: "a no worse than b" from the lower end of that interval: at the
  default ``confidence = 0.95`` (two-sided) the lower end is a **one-sided 97.5 %** bound; ``a`` is
  non-inferior when it lies above ``-margin``.

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
    the lower bound clears ``-margin``. ``design`` is ``"independent"`` (two samples) or ``"paired"`` (the
    same trials; the paired interval)."""

    difference: float
    lower_bound: float
    margin: float
    confidence: float
    noninferior: bool
    design: str = "independent"

    def describe(self) -> str:
        verdict = "non-inferior" if self.noninferior else "not shown non-inferior"
        side = ">" if self.noninferior else "<="
        one_sided = 1 - (1 - self.confidence) / 2
        return (f"difference {self.difference:+.2f}, {self.design} {self.confidence:.0%} interval's lower "
                f"end (one-sided {one_sided:.1%}) {self.lower_bound:+.2f} {side} -{self.margin:.2f} "
                f"(margin {self.margin:.2f}): {verdict}")


def noninferiority(k_new: int, n_new: int, k_ref: int, n_ref: int, margin: float,
                   confidence: float = 0.95) -> NonInferiority:
    """Is ``k_new / n_new`` no worse than ``k_ref / n_ref`` by more than ``margin`` (a rate, in (0, 1))?"""
    k_new, n_new = _counts(k_new, n_new)
    k_ref, n_ref = _counts(k_ref, n_ref)
    z = _z_for(margin, confidence)
    p_new, p_ref = k_new / n_new, k_ref / n_ref
    l_new, _ = wilson_interval(k_new, n_new, z)
    _, u_ref = wilson_interval(k_ref, n_ref, z)
    diff = p_new - p_ref
    low = diff - math.sqrt((p_new - l_new) ** 2 + (u_ref - p_ref) ** 2)
    return NonInferiority(diff, low, float(margin), float(confidence), low > -margin)


def _z_for(margin: float, confidence: float) -> float:
    """The two-sided normal quantile of ``confidence``, after checking ``margin`` and ``confidence``."""
    if not 0.0 < margin < 1.0:
        raise ValueError(f"margin is a difference of rates in (0, 1), e.g. 0.10; got {margin!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95; got {confidence!r}")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def _whole(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) and not (
            isinstance(value, float) and value.is_integer()):
        raise ValueError(f"{name} must be a whole count, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be a count >= 0, got {value!r}")
    return int(value)


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided p-value of the exact McNemar test from the discordant counts of paired trials: ``only_a``
    trials right for a and wrong for b, ``only_b`` the other way round."""
    b, c = _whole("only_a", only_a), _whole("only_b", only_b)
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m
    return min(1.0, 2 * tail)


def paired_difference_interval(both: int, only_a: int, only_b: int, neither: int,
                               confidence: float = 0.95) -> tuple[float, float]:
    """``(low, high)`` of ``rate_a - rate_b`` over paired trials: Newcombe's (1998) method 10 for paired data
    (two-sided, 95 % by default)."""
    a, b, c, d = (_whole(name, v) for name, v in
                  (("both", both), ("only_a", only_a), ("only_b", only_b), ("neither", neither)))
    n = a + b + c + d
    if n < 1:
        raise ValueError("no trials: a paired table needs at least one pair")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), e.g. 0.95; got {confidence!r}")
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p_a, p_b = (a + b) / n, (a + c) / n
    l_a, u_a = wilson_interval(a + b, n, z)
    l_b, u_b = wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    if margins == 0 or 0 <= cross <= n / 2:
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)
    diff = p_a - p_b
    da, ua, db, ub = p_a - l_a, u_a - p_a, p_b - l_b, u_b - p_b
    low = diff - math.sqrt(max(0.0, da * da - 2 * phi * da * ub + ub * ub))
    high = diff + math.sqrt(max(0.0, db * db - 2 * phi * db * ua + ua * ua))
    return max(-1.0, low), min(1.0, high)


@dataclass(frozen=True)
class Paired:
    """Paired trials of two methods a and b (the same prompts, the same seeds): how many both got right, only
    a, only b, neither. ``difference`` is ``rate_a - rate_b``; ``p_value`` the exact McNemar test;
    ``interval`` Newcombe's paired 95 % interval of the difference."""

    both: int
    only_a: int
    only_b: int
    neither: int

    def __post_init__(self) -> None:
        counts = [_whole(name, getattr(self, name)) for name in ("both", "only_a", "only_b", "neither")]
        if sum(counts) < 1:
            raise ValueError("no trials: a paired table needs at least one pair")

    @classmethod
    def of(cls, a, b) -> Paired:
        """From two aligned sequences of outcomes (booleans or 0/1), trial i of ``a`` paired with trial i of
        ``b``."""
        a, b = [bool(x) for x in a], [bool(x) for x in b]
        if len(a) != len(b) or not a:
            raise ValueError(f"paired outcomes need two non-empty lists of the same length, got {len(a)} and "
                             f"{len(b)}")
        pairs = list(zip(a, b, strict=True))
        return cls(sum(x and y for x, y in pairs), sum(x and not y for x, y in pairs),
                   sum(y and not x for x, y in pairs), sum(not x and not y for x, y in pairs))

    @classmethod
    def match(cls, rows_a, rows_b, key, value: str = "correct") -> Paired:
        """Rows of a and of b joined on ``key`` (a tuple of column names, or a function of a row), each key
        once on each side and the same keys on both; the outcome is ``row[value]``."""
        key_of = (lambda r: tuple(r[k] for k in key)) if isinstance(key, (tuple, list)) else key
        sides = []
        for side, rows in (("a", rows_a), ("b", rows_b)):
            outcomes = {}
            for r in rows:
                k = key_of(r)
                if k in outcomes:
                    raise ValueError(f"the key {k!r} occurs twice among the rows of {side}: a pair needs one "
                                     "row per trial on each side")
                outcomes[k] = bool(r[value])
            sides.append(outcomes)
        if sides[0].keys() != sides[1].keys():
            odd = sorted(sides[0].keys() ^ sides[1].keys(), key=repr)[:3]
            raise ValueError(f"the two sides do not have the same trials (e.g. {odd}): pair only trials both "
                             "ran")
        keys = list(sides[0])
        return cls.of([sides[0][k] for k in keys], [sides[1][k] for k in keys])

    @property
    def counts(self) -> tuple[int, int, int, int]:
        """``(both, only_a, only_b, neither)``: plain numbers, e.g. for a function that must receive plain
        data (``Paired(*counts)`` rebuilds the table)."""
        return self.both, self.only_a, self.only_b, self.neither

    @property
    def n(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    @property
    def rate_a(self) -> float:
        return (self.both + self.only_a) / self.n

    @property
    def rate_b(self) -> float:
        return (self.both + self.only_b) / self.n

    @property
    def difference(self) -> float:
        return (self.only_a - self.only_b) / self.n

    @property
    def discordant(self) -> int:
        return self.only_a + self.only_b

    @property
    def p_value(self) -> float:
        return mcnemar_exact(self.only_a, self.only_b)

    @property
    def interval(self) -> tuple[float, float]:
        return paired_difference_interval(self.both, self.only_a, self.only_b, self.neither)

    def __str__(self) -> str:
        lo, hi = self.interval
        k_a, k_b = self.both + self.only_a, self.both + self.only_b
        return (f"{k_a}/{self.n} vs {k_b}/{self.n} on the same trials: "
                f"{self.only_a} only a, {self.only_b} only b; difference {self.difference:+.2f} "
                f"[paired 95 % CI {lo:+.2f}, {hi:+.2f}], McNemar p = {self.p_value:.2g}")


def paired_noninferiority(table: Paired, margin: float, confidence: float = 0.95) -> NonInferiority:
    """Is a (the new method) no worse than b (the reference) by more than ``margin``, on paired trials? The
    lower end of Newcombe's paired interval at ``confidence`` (two-sided: a one-sided bound at
    ``1 - (1 - confidence) / 2``, 97.5 % by default) against ``-margin``."""
    if not isinstance(table, Paired):
        raise ValueError("paired_noninferiority takes a Paired table (Paired.of(new, ref)), got "
                         f"{type(table).__name__}")
    _z_for(margin, confidence)
    low, _ = paired_difference_interval(table.both, table.only_a, table.only_b, table.neither, confidence)
    return NonInferiority(table.difference, low, float(margin), float(confidence), low > -margin, "paired")
