"""Roofline: intensity, ridge points and which bound is active."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longctx.flops import step_cost
from longctx.roofline import (
    arithmetic_intensity,
    matmul_intensity,
    ridge_point,
    roofline_time,
    step_time_s,
)
from longctx.specs import get_hardware


def test_ridge_points():
    assert ridge_point("h100") == pytest.approx(989e12 / 3.35e12)  # ~295 FLOP/byte
    assert ridge_point("a100") == pytest.approx(153.0, abs=0.1)
    assert ridge_point("h200") == pytest.approx(206.0, abs=0.1)
    assert ridge_point("h100", compute_efficiency=0.5) == pytest.approx(ridge_point("h100") / 2)
    assert ridge_point(get_hardware("h100")) == get_hardware("h100").ridge_flops_per_byte


def test_matmul_intensity():
    # decode: one token against a 4096x4096 bf16 weight ~ 1 FLOP/byte
    assert matmul_intensity(1, 4096, 4096, "bf16") == pytest.approx(
        2 * 4096 * 4096 / (2 * (4096 + 4096**2 + 4096))
    )
    assert matmul_intensity(4096, 4096, 4096, "bf16") == pytest.approx(4096 / 3)
    # bf16, square weight: n*d / (d + 2n): ~n for n << d, saturating below d/2 (issue 12, item 11)
    for n in (1, 16, 12_000, 10**7):
        assert matmul_intensity(n, 4096, 4096, "bf16") == pytest.approx(n * 4096 / (4096 + 2 * n))
    assert matmul_intensity(12_000, 4096, 4096) == pytest.approx(1749.43, abs=0.01)
    assert matmul_intensity(10**9, 4096, 4096) < 2048
    assert matmul_intensity(64, 4096, 4096, "fp8") == pytest.approx(
        2 * matmul_intensity(64, 4096, 4096, "bf16")
    )
    with pytest.raises(ValueError, match="positive integer"):
        matmul_intensity(0, 4, 4)


def test_exercise1_prefill_time_at_150_tflops():
    r = roofline_time(1.68e14, 1.4e10, "h100", peak_flops_per_s=150e12)
    assert r.time_s == pytest.approx(1.12) and r.bound == "compute"


def test_step_time_and_bound():
    r = roofline_time(1e12, 1e9, "h100")
    assert r.compute_s == pytest.approx(1e12 / 989e12)
    assert r.memory_s == pytest.approx(1e9 / 3.35e12)
    assert r.bound == "compute" and r.time_s == r.compute_s
    assert step_time_s(1e9, 1e12, "h100", memory_efficiency=0.5) == pytest.approx(2e12 / 3.35e12)
    assert roofline_time(1e9, 1e12, "h100").bound == "memory"


def test_decode_memory_bound_prefill_compute_bound():
    dec = step_cost("llama-3-8b", [(1, 8192)] * 16)
    pre = step_cost("llama-3-8b", [(8192, 0)])
    assert roofline_time(dec.flops, dec.bytes, "h100").bound == "memory"
    assert roofline_time(pre.flops, pre.bytes, "h100").bound == "compute"
    assert arithmetic_intensity(dec.flops, dec.bytes) < ridge_point("h100") < arithmetic_intensity(
        pre.flops, pre.bytes
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: arithmetic_intensity(1.0, 0), "> 0"),
        (lambda: arithmetic_intensity(-1.0, 1), ">= 0"),
        (lambda: roofline_time(1, 1, "h100", compute_efficiency=0), r"\(0, 1\]"),
        (lambda: roofline_time(1, 1, "h100", memory_efficiency=1.5), r"\(0, 1\]"),
        (lambda: roofline_time(1, 1, "tpu"), "allowed"),
        (lambda: roofline_time(1, 1, "h100", peak_flops_per_s=0), "positive"),
    ],
)
def test_rejects_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@given(st.floats(0, 1e18), st.floats(1, 1e13), st.sampled_from(["a100", "h100", "h200"]))
def test_time_is_max_and_bound_matches_ridge(flops, nbytes, hw):
    r = roofline_time(flops, nbytes, hw)
    assert r.time_s == max(r.compute_s, r.memory_s)
    intensity = arithmetic_intensity(flops, nbytes)
    if intensity > ridge_point(hw) * (1 + 1e-9):
        assert r.bound == "compute"
    elif intensity < ridge_point(hw) * (1 - 1e-9):
        assert r.bound == "memory"
