"""Seeded workloads: reproducible, rates and lengths right in expectation."""

import math

import numpy as np
import pytest

from longctx.sim import Fixed, LogNormal, Trace, Uniform, arrival_times, make_workload


def test_same_seed_same_workload_other_seed_differs():
    a = make_workload(200, 4.0, Uniform(10, 500), LogNormal(100, 0.5), seed=7)
    b = make_workload(200, 4.0, Uniform(10, 500), LogNormal(100, 0.5), seed=7)
    c = make_workload(200, 4.0, Uniform(10, 500), LogNormal(100, 0.5), seed=8)
    assert a == b and a != c


@pytest.mark.parametrize("arrival,burstiness", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0)])
def test_mean_rate_is_right(arrival, burstiness):
    wl = make_workload(20_000, 5.0, 10, 10, seed=1, arrival=arrival, burstiness=burstiness)
    t = np.array([r.arrival_s for r in wl])
    assert np.all(np.diff(t) >= 0)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.03)
    # gamma gaps: coefficient of variation 1/sqrt(shape); Poisson (exponential) has CV 1
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_rate_sends_everything_at_zero():
    assert np.all(arrival_times(10, math.inf, np.random.default_rng(0)) == 0)


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert set(Fixed(7).sample(rng, 5)) == {7}
    u = Uniform(3, 9).sample(rng, 20_000)
    assert u.min() == 3 and u.max() == 9 and u.mean() == pytest.approx(6, rel=0.02)
    ln = LogNormal(200, 0.5).sample(rng, 20_000)
    assert np.median(ln) == pytest.approx(200, rel=0.03)
    assert ln.mean() == pytest.approx(LogNormal(200, 0.5).mean, rel=0.03)
    assert LogNormal(200, 2.0, low=10, high=300).sample(rng, 1000).max() <= 300
    assert list(Trace((5, 6, 7), replay=True).sample(rng, 5)) == [5, 6, 7, 5, 6]
    assert set(Trace((5, 6, 7)).sample(rng, 100)) <= {5, 6, 7}


@pytest.mark.parametrize("bad", [
    lambda: make_workload(0, 1.0, 10, 10), lambda: make_workload(10, 0.0, 10, 10),
    lambda: make_workload(10, 1.0, 10, 10, arrival="uniform"), lambda: Uniform(5, 2), lambda: Fixed(0),
    lambda: Trace(()), lambda: LogNormal(-1.0),
])
def test_bad_parameters_raise_value_error(bad):
    with pytest.raises(ValueError):
        bad()
