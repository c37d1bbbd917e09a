"""GemmProfile (longctx.sim.gemm_profile): interpolation, validation, and the cost model pricing GEMMs from
it."""

from __future__ import annotations

import numpy as np
import pytest

from longctx.sim import CostFactors, CostModelExecutor, MeasuredStep, calibrate
from longctx.sim.gemm_profile import GROUPS, GemmProfile, measure_gemm_profile
from longctx.sim.operators import embedding_time_s
from longctx.sim.step_terms import design_row, operator_terms
from longctx.specs import HardwareSpec

ROWS = (1, 2, 3, 4, 8, 64)
# a stair no roofline has: 3 rows dearer than 4 (as one CPU's LM head was, the module docstring)
SECONDS = {g: (1e-3, 2e-3, 3e-3, 1.5e-3, 2e-3, 9e-3) for g in GROUPS}
CPU = HardwareSpec("test-cpu", 1e11, 2e10, 8e9, source="a made-up CPU for these tests")


def profile() -> GemmProfile:
    return GemmProfile("smollm2-135m", ROWS, SECONDS)


def test_seconds_are_exact_at_measured_rows_and_linear_between_and_beyond():
    p = profile()
    assert [p.seconds_at("qkv", n) for n in ROWS] == list(SECONDS["qkv"])
    assert p.seconds_at("o", 6) == pytest.approx((1.5e-3 + 2e-3) / 2)  # halfway from 4 to 8
    assert p.seconds_at("down", 120) == pytest.approx(9e-3 + (9e-3 - 2e-3) * (120 - 64) / 56)  # last slope
    assert p.seconds_at("lm_head", 0) == 0.0
    assert GemmProfile.from_dict(p.to_dict()) == p
    with pytest.raises(ValueError, match="unknown GEMM group"):
        p.seconds_at("attention", 4)


@pytest.mark.parametrize("rows,seconds,match", [
    ((1,), {g: (1e-3,) for g in GROUPS}, "at least two"),
    ((2, 1), {g: (1e-3, 1e-3) for g in GROUPS}, "ascending"),
    ((1, 2), {"qkv": (1e-3, 1e-3)}, "exactly the groups"),
    ((1, 2), {g: (1e-3, 0.0) for g in GROUPS}, "times > 0"),
    ((0, 2), {g: (1e-3, 1e-3) for g in GROUPS}, "rows"),
])  # fmt: skip
def test_a_bad_profile_is_a_clear_error(rows, seconds, match):
    with pytest.raises(ValueError, match=match):
        GemmProfile("smollm2-135m", rows, seconds)


def test_the_profiled_cost_model_prices_gemms_from_the_profile():
    k = CostFactors(gemm_tile_tokens=1)
    ex = CostModelExecutor(
        "smollm2-135m", CPU, k, weight_dtype="fp32", kv_dtype="fp32", gemm_profile=profile()
    )
    base = CostModelExecutor("smollm2-135m", CPU, k, weight_dtype="fp32", kv_dtype="fp32")
    embedding = embedding_time_s(base.model, 3, k, CPU.memory_bandwidth_bytes_per_s, 4.0)  # still modelled
    assert ex.linear_time_s(3) == pytest.approx(5 * 3e-3 + embedding)  # four GEMM groups and the small ops
    assert ex.linear_time_s(3) < base.linear_time_s(3)  # (the made-up profile is faster than the roofline)
    # the stair shows in whole steps: three decodes dearer than four
    three, four = ex.step_time_s([(1, 10)] * 3), ex.step_time_s([(1, 10)] * 4)
    assert three > four
    # a fresh chunk's attention is measured (causal_attention); a chunk after a prefix and a decode are
    # modelled
    # LM head (1 row), attention
    fresh = k.step_overhead_s + k.per_sequence_overhead_s + ex.linear_time_s(64) + 1e-3 + 9e-3
    assert ex.step_time_s([(64, 0)]) == pytest.approx(fresh)
    assert ex.step_time_s([(64, 100)]) != pytest.approx(fresh)
    assert ex.with_factors(k).gemm_profile is ex.gemm_profile
    with pytest.raises(ValueError, match="tensor parallelism 1"):
        ex.linear_time_s(8, tp=2)
    with pytest.raises(ValueError, match="profile of smollm2-135m"):
        CostModelExecutor("smollm2-135m", CPU, gemm_profile=GemmProfile("llama-3-8b", ROWS, SECONDS))
    with pytest.raises(ValueError, match="form='operator'"):
        CostModelExecutor("smollm2-135m", CPU, form="batch", gemm_profile=profile())


def test_the_fits_design_row_is_the_profiled_step_time_and_calibration_recovers_the_overheads():
    truth = CostFactors(gemm_tile_tokens=1, step_overhead_s=0.02, per_sequence_overhead_s=0.004,
                        attention_efficiency=0.4)
    ex = CostModelExecutor(
        "smollm2-135m", CPU, truth, weight_dtype="fp32", kv_dtype="fp32", gemm_profile=profile()
    )
    k = ex.factors
    theta = np.array([k.step_overhead_s, k.per_sequence_overhead_s, 1 / k.compute_efficiency,
                      1 / k.attention_efficiency, 1 / k.memory_efficiency])
    batches = [
        [(1, 100)] * 3, [(64, 0)], [(60, 200), (1, 50), (1, 900)], [(1, 30)], [(8, 8), (1, 5)], [(1, 7)] * 6,
    ]
    for seqs in batches:
        row, const = design_row(operator_terms(ex, seqs), theta, k.serial_fraction)
        assert float(row @ theta + const) == pytest.approx(ex.step_time_s(seqs), rel=1e-9), seqs
    steps = [MeasuredStep(tuple(s), ex.step_time_s(s)) for s in batches]
    start = ex.with_factors(CostFactors(gemm_tile_tokens=1))
    cal = calibrate(start, steps)
    assert cal.factors.step_overhead_s == pytest.approx(0.02, rel=1e-3)
    assert cal.factors.per_sequence_overhead_s == pytest.approx(0.004, rel=1e-3)


def test_measuring_a_profile_times_every_group_at_every_row_count():
    pytest.importorskip("torch")
    p = measure_gemm_profile("smollm2-135m", rows=(1, 4), repeats=1)
    assert p.rows == (1, 4) and set(p.seconds) == set(GROUPS)
    assert all(t > 0 for ts in p.seconds.values() for t in ts)
    assert "measured" in p.source


def test_the_median_of_several_profiles_and_their_spread():
    p, q, r = (GemmProfile("smollm2-135m", ROWS, {g: tuple(f * t for t in SECONDS[g]) for g in GROUPS})
               for f in (1.0, 1.2, 0.9))
    med = GemmProfile.median_of([p, q, r])
    assert med.seconds == p.seconds and "median of 3" in med.source
    assert GemmProfile.spread_of([p, q, r])["qkv"] == pytest.approx(1.2 / 0.9 - 1)
    with pytest.raises(ValueError, match="same row counts"):
        GemmProfile.median_of(
            [p, GemmProfile("smollm2-135m", ROWS[:-1], {g: v[:-1] for g, v in SECONDS.items()})]
        )
