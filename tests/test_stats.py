"""Wilson intervals, Fisher's exact test, the bootstrap, the t-interval of a mean and the paired tools (exact
McNemar, Newcombe's paired interval, paired non-inferiority) of longctx.evals.stats: reference values (scipy,
published tables, hand-worked) and invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.evals.stats import (
    NonInferiority,
    Paired,
    Rate,
    bootstrap_diff,
    compare_rates,
    fisher_exact,
    holm_adjusted,
    mcnemar_exact,
    mean_interval,
    noninferiority,
    paired_difference_interval,
    paired_noninferiority,
    wilson_interval,
)


def test_wilson_matches_hand_worked_values():
    # 12/15: p = 0.8, z = 1.96: centre 0.7388, half-width 0.1907 (worked by hand from the formula)
    lo, hi = wilson_interval(12, 15)
    assert lo == pytest.approx(0.5481, abs=1e-4) and hi == pytest.approx(0.9295, abs=1e-4)
    # 0/10 and 10/10 are not zero-width: 1 - 0.7225 = 0.2775 = z^2 / (n + z^2)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    # 2/2, the "U shape"'s ends: the interval still reaches down to 0.34
    assert wilson_interval(2, 2)[0] == pytest.approx(0.3424, abs=1e-4)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 500), data=st.data())
def test_wilson_contains_the_rate_stays_in_0_1_and_is_symmetric(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    lo2, hi2 = wilson_interval(n - k, n)
    assert lo2 == pytest.approx(1 - hi, abs=1e-12) and hi2 == pytest.approx(1 - lo, abs=1e-12)
    if n <= 250:  # more trials at the same rate: a narrower interval
        lo4, hi4 = wilson_interval(2 * k, 2 * n)
        assert hi4 - lo4 < hi - lo


def _fisher_by_enumeration(k1, n1, k2, n2):
    """Every table with the same margins, probabilities from binomial coefficients (no logs)."""
    c = k1 + k2
    probs = {a: math.comb(n1, a) * math.comb(n2, c - a) / math.comb(n1 + n2, c)
             for a in range(max(0, c - n2), min(n1, c) + 1)}
    return sum(p for p in probs.values() if p <= probs[k1] * (1 + 1e-7))


def test_fisher_matches_hand_worked_tables():
    # the lady tasting tea: 3 of 4 against 1 of 4, two-sided p = 34/70
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(34 / 70, rel=1e-12)
    # 2 of 6 against 4 of 6 (H2O against one random seed in the old record): far from significant
    assert fisher_exact(2, 6, 4, 6) == pytest.approx(0.5671, abs=1e-4)
    # 20/20 against 10/20: p = 2 * C(20,10)... = 3.8e-4
    assert fisher_exact(20, 20, 10, 20) == pytest.approx(_fisher_by_enumeration(20, 20, 10, 20), rel=1e-9)
    assert fisher_exact(20, 20, 10, 20) < 1e-3
    assert fisher_exact(5, 10, 5, 10) == pytest.approx(1.0)


@settings(max_examples=150, deadline=None)
@given(n1=st.integers(1, 40), n2=st.integers(1, 40), data=st.data())
def test_fisher_invariants(n1, n2, data):
    k1, k2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
    p = fisher_exact(k1, n1, k2, n2)
    assert 0.0 < p <= 1.0
    assert p == pytest.approx(_fisher_by_enumeration(k1, n1, k2, n2), rel=1e-6)
    assert p == pytest.approx(fisher_exact(k2, n2, k1, n1), rel=1e-9), "groups swapped"
    assert p == pytest.approx(fisher_exact(n1 - k1, n1, n2 - k2, n2), rel=1e-9), "successes <-> failures"


def test_bootstrap_separates_shifted_groups_and_not_equal_ones():
    a = [-1.0, -1.2, -0.9, -1.1, -1.05, -0.95, -1.0, -1.15]
    b = [x - 3.0 for x in a]
    out = bootstrap_diff(a, b, seed=1)
    assert out["diff"] == pytest.approx(3.0) and out["low"] > 2.5 and out["high"] < 3.5
    assert out["p_value"] == pytest.approx(1e-4) and out["n_a"] == 8
    same = bootstrap_diff(a, list(reversed(a)), seed=1)
    assert same["low"] < 0 < same["high"] and same["p_value"] > 0.5
    assert bootstrap_diff(a, b, seed=1) == out, "seeded: the same resamples"


def test_rate_and_comparison():
    r = Rate.of([True] * 12 + [False] * 3)
    assert (r.k, r.n, r.rate) == (12, 15, 0.8)
    assert str(r) == "12/15 = 0.80 [95 % CI 0.55, 0.93]"
    c = compare_rates(Rate(20, 20), Rate(10, 20))
    assert c["significant"] and c["difference"] == 0.5
    assert not compare_rates(Rate(2, 6), Rate(4, 6))["significant"]


def test_mean_interval_matches_hand_worked_values():
    # 1, 2, 3: mean 2, s = 1, t(0.975, 2) = 4.303 -> 2 +- 4.303 / sqrt(3)
    assert mean_interval([1, 2, 3]) == pytest.approx((2.0, 2 - 4.303 / 3 ** 0.5, 2 + 4.303 / 3 ** 0.5))
    # six values, s = 0.01871: t(0.975, 5) = 2.571
    mean, low, high = mean_interval([0.01, -0.02, 0.03, 0.0, -0.01, 0.02])
    assert mean == pytest.approx(0.005) and high - mean == pytest.approx(2.571 * 0.0187083 / 6 ** 0.5,
                                                                         rel=1e-4)
    # past 30 degrees of freedom the normal's quantile
    assert mean_interval([0, 1] * 20)[2] - 0.5 == pytest.approx(1.96 * 0.5064 / 40 ** 0.5, rel=1e-3)


def test_holm_matches_hand_worked_family():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): 4 x 0.005, 3 x 0.01, 2 x 0.03, then max(0.06, 1 x 0.04) = 0.06
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjusted([0.5, 0.9]) == [1.0, 1.0], "capped at 1"
    assert holm_adjusted([0.04]) == [0.04], "a family of one is not corrected"


@settings(max_examples=150, deadline=None)
@given(ps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=25))
def test_holm_invariants(ps):
    adj = holm_adjusted(ps)
    m = len(ps)
    assert len(adj) == m
    for p, a in zip(ps, adj, strict=True):
        assert p <= a + 1e-15 and a <= min(1.0, m * p) + 1e-15, "between the raw p and Bonferroni's"
    order = sorted(range(m), key=lambda i: ps[i])
    assert all(adj[i] <= adj[j] for i, j in zip(order, order[1:], strict=False)), \
        "monotone in the raw p-values"
    assert holm_adjusted(list(reversed(ps))) == list(reversed(adj)), "same order as the input"


def test_noninferiority_matches_newcombe_1998():
    # Newcombe (1998), Stat Med 17:873, table II, method 10: 56/70 - 48/80 = 0.2000 [0.0524, 0.3339];
    # 9/10 - 3/10 = 0.6000 [0.1705, 0.8090]
    ni = noninferiority(56, 70, 48, 80, margin=0.10)
    assert isinstance(ni, NonInferiority) and ni.difference == pytest.approx(0.2)
    assert ni.lower_bound == pytest.approx(0.0524, abs=1e-4) and ni.noninferior
    assert noninferiority(9, 10, 3, 10, margin=0.05).lower_bound == pytest.approx(0.1705, abs=1e-4)
    with pytest.raises(AttributeError):
        ni.margin = 0.5  # frozen


def test_noninferiority_verdict_and_description():
    # 15/30 against 20/30 (p = 0.30 by Fisher: "not significant") is not evidence of no loss
    ni = noninferiority(15, 30, 20, 30, margin=0.10)
    assert fisher_exact(15, 30, 20, 30) > 0.05 and not ni.noninferior and ni.lower_bound < -0.10
    assert "margin 0.10" in ni.describe() and "not shown non-inferior" in ni.describe()
    # equal rates at large n clear a 0.10 margin; at n = 10 they do not
    assert noninferiority(400, 500, 400, 500, margin=0.10).noninferior
    assert not noninferiority(8, 10, 8, 10, margin=0.10).noninferior
    # a wider confidence gives a lower bound further down
    assert (noninferiority(40, 50, 40, 50, 0.1, 0.99).lower_bound
            < noninferiority(40, 50, 40, 50, 0.1).lower_bound)


@settings(max_examples=150, deadline=None)
@given(n1=st.integers(1, 200), n2=st.integers(1, 200), data=st.data())
def test_noninferiority_bound_lies_below_the_difference_and_within_range(n1, n2, data):
    k1, k2 = data.draw(st.integers(0, n1)), data.draw(st.integers(0, n2))
    ni = noninferiority(k1, n1, k2, n2, margin=0.1)
    assert -1.0 - 1e-12 <= ni.lower_bound <= ni.difference <= 1.0
    assert ni.noninferior == (ni.lower_bound > -0.1)


@pytest.mark.parametrize("only_a,only_b", [(0, 10), (10, 0), (3, 7), (5, 5), (1, 11), (11, 0), (0, 1),
                                           (17, 31), (40, 2), (0, 0)])
def test_mcnemar_exact_matches_scipy_binomtest(only_a, only_b):
    scipy_stats = pytest.importorskip("scipy.stats")
    want = 1.0 if only_a + only_b == 0 else scipy_stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert mcnemar_exact(only_a, only_b) == pytest.approx(want, rel=1e-12)
    # lesson 05's 10/10 against 0/10 on the same prompts: 10 discordant pairs, all one way: 2 / 2^10
    assert mcnemar_exact(10, 0) == pytest.approx(0.001953125)


def test_paired_interval_matches_published_values():
    # Fagerland, Lydersen & Laake (2017), "Statistical Analysis of Contingency Tables", ch. 8, the Cavo et al.
    # (2012) table [[59, 6], [16, 80]]: Newcombe's square-and-add interval -0.0621 [-0.1186, -0.0046]
    low, high = paired_difference_interval(59, 6, 16, 80)
    assert Paired(59, 6, 16, 80).difference == pytest.approx(-10 / 161)
    assert low == pytest.approx(-0.1186, abs=1e-4) and high == pytest.approx(-0.0046, abs=1e-4)
    # hand-worked: 0 <= ad - bc <= n/2 sets phi* to 0 (here ad - bc = 5 = n/2), and the interval is then the
    # unpaired method-10 interval of the two margins, 5/10 against 5/10: Wilson [0.2366, 0.7634] each, so
    # -sqrt(2) * 0.2634 = -0.3725
    assert paired_difference_interval(3, 2, 2, 3)[0] == pytest.approx(-0.3725, abs=1e-4)
    unpaired = noninferiority(5, 10, 5, 10, 0.1).lower_bound
    assert paired_difference_interval(3, 2, 2, 3)[0] == pytest.approx(unpaired)


def test_paired_interval_is_narrow_when_the_trials_agree():
    # 10/30 against 10/30 on the same 30 trials, no pair differing: the paired bound is far tighter than the
    # unpaired one, which treats the two 10/30 as independent samples
    paired = paired_noninferiority(Paired(10, 0, 0, 20), margin=0.10)
    unpaired = noninferiority(10, 30, 10, 30, margin=0.10)
    assert paired.noninferior and paired.lower_bound > -0.10 > unpaired.lower_bound
    assert paired.design == "paired" and "paired" in paired.describe()
    assert "one-sided 97.5%" in paired.describe()
    assert "independent" in unpaired.describe()
    # a loss on every discordant pair is not hidden by the pairing: 0 gained, 11 lost of 30
    lost = Paired(10, 0, 11, 9)
    assert lost.p_value == pytest.approx(2 / 2**11) and lost.interval[1] < 0
    assert not paired_noninferiority(lost, 0.10).noninferior


@settings(max_examples=200, deadline=None)
@given(counts=st.tuples(*[st.integers(0, 40)] * 4).filter(lambda c: sum(c) > 0))
def test_paired_interval_contains_the_difference_and_stays_in_range(counts):
    table = Paired(*counts)
    low, high = table.interval
    assert -1.0 <= low <= table.difference + 1e-12 and table.difference - 1e-12 <= high <= 1.0
    assert table.rate_a - table.rate_b == pytest.approx(table.difference)
    flipped = Paired(counts[0], counts[2], counts[1], counts[3])
    assert flipped.interval == (pytest.approx(-high), pytest.approx(-low)), "swapping a and b mirrors it"
    assert table.p_value == flipped.p_value


def test_paired_match_joins_rows_on_their_key():
    a = [{"seed": s, "depth": d, "correct": s % 2 == 0} for s in range(4) for d in (0.1, 0.5)]
    b = [{"seed": s, "depth": d, "correct": True} for d in (0.5, 0.1) for s in reversed(range(4))]
    table = Paired.match(a, b, ("seed", "depth"))
    assert (table.both, table.only_a, table.only_b, table.neither) == (4, 0, 4, 0)
    assert Paired.match(a, b, lambda r: (r["seed"], r["depth"])) == table
    with pytest.raises(ValueError, match="same trials"):
        Paired.match(a, b[:-1], ("seed", "depth"))
    with pytest.raises(ValueError, match="occurs twice"):
        Paired.match(a + a[:1], b, ("seed", "depth"))
    assert Paired.of([True, False, True], [True, True, False]) == Paired(1, 1, 1, 0)
    assert table.counts == (4, 0, 4, 0) and Paired(*table.counts) == table


@pytest.mark.parametrize("call,match", [
    (lambda: mcnemar_exact(-1, 3), ">= 0"),
    (lambda: mcnemar_exact(1.5, 3), "whole count"),
    (lambda: paired_difference_interval(0, 0, 0, 0), "no trials"),
    (lambda: Paired(0, 0, 0, 0), "no trials"),
    (lambda: Paired.of([True], [True, False]), "same length"),
    (lambda: paired_noninferiority(Paired(1, 0, 0, 1), margin=1.5), "margin"),
    (lambda: paired_noninferiority((1, 0, 0, 1), margin=0.1), "Paired table"),
    (lambda: holm_adjusted([]), "at least one"),
    (lambda: holm_adjusted([0.1, 1.2]), r"\[0, 1\]"),
    (lambda: holm_adjusted([float("nan")]), r"\[0, 1\]"),
    (lambda: noninferiority(5, 10, 5, 10, margin=0.0), "margin"),
    (lambda: noninferiority(5, 10, 5, 10, margin=10), "margin"),
    (lambda: noninferiority(5, 10, 5, 10, margin=0.1, confidence=95), "confidence"),
    (lambda: noninferiority(11, 10, 5, 10, margin=0.1), "0 <= k <= n"),
    (lambda: mean_interval([1.0]), "at least 2"),
    (lambda: mean_interval([1.0, float("inf")]), "finite"),
    (lambda: wilson_interval(3, 2), "0 <= k <= n"),
    (lambda: wilson_interval(1.5, 4), "whole counts"),
    (lambda: wilson_interval(0, 0), "n >= 1"),
    (lambda: fisher_exact(1, 2, -1, 3), "0 <= k <= n"),
    (lambda: Rate.of([]), "no trials"),
    (lambda: bootstrap_diff([1.0], [2.0, 3.0]), "at least 2 values"),
    (lambda: bootstrap_diff([1.0, float("nan")], [2.0, 3.0]), "finite"),
])  # fmt: skip
def test_bad_input_is_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
