"""The simulator's H100 defaults are what the fit on the shipped Vidur profiles gives, and
benchmarks/sim_profiles.py states the fit's error per model, TP degree and token range (issue 26)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from longctx.sim.calibration import fit_profiles, leave_one_model_out, profile_errors
from longctx.sim.factors import FITTED_H100, CostFactors
from longctx.sim.profiles import load_profiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sim_profiles  # noqa: E402


def test_the_defaults_are_the_refit_factors():
    fit = fit_profiles().factors
    for name, value in FITTED_H100.items():
        assert getattr(fit, name) == pytest.approx(value, rel=0.02), name  # FITTED_H100 keeps two digits
        assert getattr(CostFactors(), name) == value, f"CostFactors() does not default {name} to the fitted value"


def test_errors_name_where_the_model_misses_by_more_than_15_percent():
    rows = profile_errors(tps=[1])
    assert {r.model for r in rows} == set(load_profiles())
    for r in rows:
        assert abs(r.worst_error) <= 0.15 or r.over_15_percent, r
        assert all(r.low_tokens <= n <= r.high_tokens for n in r.over_15_percent)


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
