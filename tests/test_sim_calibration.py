"""The simulator's H100 defaults are what the fit on the shipped Vidur profiles gives, and
benchmarks/sim_profiles.py states the fit's error per model, TP degree and token range (issue 26)."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from longctx.sim.calibration import (
    fit_profiles,
    leave_one_model_out,
    linear_time_points,
    monotone_error_bound,
    profile_errors,
)
from longctx.sim.factors import FITTED_H100, CostFactors
from longctx.sim.profiles import load_profiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sim_profiles  # noqa: E402
from sim_profiles import score_factors, search_factors  # noqa: E402


def test_the_defaults_are_the_refit_factors():
    fit = fit_profiles().factors
    for name, value in FITTED_H100.items():
        assert getattr(fit, name) == pytest.approx(value, rel=0.02), name  # FITTED_H100 keeps two digits
        assert getattr(CostFactors(), name) == value, (
            f"CostFactors() does not default {name} to the fitted value"
        )


def test_errors_name_where_the_model_misses_by_more_than_15_percent():
    rows = profile_errors(tps=[1])
    assert {r.model for r in rows} == set(load_profiles())
    for r in rows:
        assert abs(r.worst_error) <= 0.15 or r.over_15_percent, r
        assert all(r.low_tokens <= n <= r.high_tokens for n in r.over_15_percent)


# Issue 26: at TP 1, 64-4,096 tokens, the fitted model is within 15 % of every profiled point except these
# (kernel choices of the library that tile and wave quantization do not predict; 54 of 1,245 points).
TP1_MISSES = {
    "CodeLlama-34b-Instruct-hf": (328, 336, 344, 352, 360, 368, 376, 384),
    "Llama-2-70b-hf": (480, 488, 536, 544),
    "Qwen-72B": (328, 352, 376, 384, 536, 584, 592, 600, 608, 616, 624, 632, 640, 1296), "internlm-20b": (),
    "phi-2": (136, 144, 168, 176, 184, 192, *range(776, 929, 8), 1016, 1024),
}


def test_within_15_percent_at_tp1_except_the_named_points():
    rows = profile_errors(tps=[1], ranges=((64, 4096),))
    assert {r.model: r.over_15_percent for r in rows} == TP1_MISSES
    assert all(abs(r.worst_error) < 0.26 for r in rows)  # and no miss is far off


def test_leave_one_model_out_fits_without_the_held_model():
    result = leave_one_model_out(tps=[1])
    assert set(result) == set(load_profiles())
    for held, (fit, errors) in result.items():
        assert held not in fit.models and {e.model for e in errors} == {held}


def test_the_benchmark_prints_every_model(capsys):
    assert sim_profiles.main(["--tp", "1", "--tokens", "64,4096"]) == 0
    out = capsys.readouterr().out
    for name in load_profiles():
        assert f"{name} TP 1 (measured/predicted)" in out
    assert "LOO worst" in out and "over 15 % at" in out
    assert "TP 1: 1191 of 1245 points" in out and "the floor" in out
    assert "the form or the fit?" in out and "all five held out" in out


def test_scoring_agrees_with_the_per_range_errors():
    score = score_factors(CostFactors())
    rows = profile_errors(tps=[1], ranges=((64, 4096),))
    assert score.num_points == sum(r.num_points for r in rows) == 1245
    assert score.misses == sum(len(r.over_15_percent) for r in rows) == sum(map(len, TP1_MISSES.values()))
    assert score.worst_abs_error == pytest.approx(max(abs(r.worst_error) for r in rows), rel=1e-9)


def test_the_search_returns_the_best_point_of_its_grid():
    grid = {"compute_efficiency": (0.6, 0.8), "memory_efficiency": (0.9, 1.0), "serial_fraction": (0.0, 0.3),
            "kernel_overhead_s": (0.0, 1e-5)}
    points = [
        replace(
            CostFactors(), compute_efficiency=c, memory_efficiency=m, serial_fraction=s, kernel_overhead_s=o
        )
        for c, m, s, o in itertools.product(*grid.values())
    ]
    scores = [score_factors(f, ["phi-2", "Qwen-72B"]) for f in points]
    for objective, key in (("misses", lambda x: (x.misses, x.worst_abs_error)),
                           ("worst", lambda x: (x.worst_abs_error, x.misses))):
        best = search_factors(["phi-2", "Qwen-72B"], objective=objective, grid=grid)
        assert key(best) == pytest.approx(key(min(scores, key=key)))
        # the score belongs to the factors returned
        again = score_factors(best.factors, ["phi-2", "Qwen-72B"])
        assert (again.misses, again.worst_abs_error, again.median_abs_error) == pytest.approx(
            (best.misses, best.worst_abs_error, best.median_abs_error))


def test_no_factors_on_the_grid_are_within_15_percent_everywhere():
    """The form, not the fit, is the limit: the smallest worst error over SEARCH_GRID is above 20 %."""
    best = search_factors(objective="worst")
    assert best.worst_abs_error > 0.20 and best.misses > 0
    assert search_factors(objective="misses").misses > 0


def test_the_search_says_what_it_accepts():
    with pytest.raises(ValueError, match="objective must be one of misses, worst"):
        search_factors(objective="rms")
    with pytest.raises(ValueError, match="unknown profiled models"):
        search_factors(["Llama-2-7b"])
    with pytest.raises(ValueError, match="profiled at TP 1, not 2"):
        score_factors(CostFactors(), ["phi-2"], tp=2)
    with pytest.raises(ValueError, match="unknown profiled models"):
        score_factors(CostFactors(), ["Llama-3-8b"])
    with pytest.raises(ValueError, match="no profiled point of phi-2 at TP 1 in 5000"):
        score_factors(CostFactors(), ["phi-2"], low_tokens=5000, high_tokens=6000)


def test_no_factors_beat_the_monotone_floor():
    """The operator form never gets faster with more tokens, so its worst error is at least the floor; the
    floor is under 15 % for every model: the data do not forbid the target, the form's four factors miss
    it."""
    for name in load_profiles():
        pts = [(n, p) for n, _, p in linear_time_points(name, 1) if 64 <= n <= 4096]
        assert all(p1 <= p2 * (1 + 1e-12) for (_, p1), (_, p2) in itertools.pairwise(pts)), name
        floor, a, b = monotone_error_bound(name, 1)
        worst = max(abs(e.worst_error) for e in profile_errors(models=[name], tps=[1], ranges=((64, 4096),)))
        assert 0 < floor < 0.15 and a < b and worst >= floor - 1e-12, (name, floor, worst)


def test_the_monotone_floor_on_a_hand_case(monkeypatch):
    from longctx.sim import calibration

    class Fake:
        num_tokens = {1: [64, 128, 256, 512]}
        tp_degrees = (1,)

        def linear_time_s(self, tp):
            return [1.0, 3.0, 2.0, 4.0]  # falls 3 -> 2 between 128 and 256: floor (3 - 2) / (3 + 2)

    monkeypatch.setattr(calibration, "load_profiles", lambda: {"fake": Fake()})
    assert monotone_error_bound("fake") == pytest.approx((0.2, 128, 256))
    with pytest.raises(ValueError, match="no profile at TP 2"):
        monotone_error_bound("fake", 2)
    with pytest.raises(ValueError, match="unknown profiled model"):
        monotone_error_bound("nope")
