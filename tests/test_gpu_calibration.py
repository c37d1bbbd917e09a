"""Calibrating the simulator's cost model from a GPU record (benchmarks/gpu_calibration.py): predicted versus
measured step times."""

import subprocess
import sys
from pathlib import Path

import pytest
from gpu_fixtures import small_record

from longctx.gpu.records import save_record
from longctx.sim import CostFactors
from longctx.specs import get_hardware

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from gpu_calibration import SOURCES, calibrate_from_record, measured_steps, record_hardware  # noqa: E402

TRUE = CostFactors(compute_efficiency=0.7, attention_efficiency=0.4, memory_efficiency=0.85,
                   step_overhead_s=2e-3, per_sequence_overhead_s=1e-5)


@pytest.fixture(scope="module")
def record():
    return small_record(TRUE)


def test_measured_steps_cover_every_source(record):
    steps = measured_steps(record)
    by = {s: [m for src, m in steps if src == s] for s in SOURCES}
    assert len(by["prefill_chunks"]) == sum(len(r["chunks"]) for r in record["prefill_chunks"])
    assert len(by["decode"]) == len(record["decode"])
    d = record["decode"][-1]
    assert by["decode"][-1].sequences == ((1, d["context_tokens"]),) * d["batch_size"]
    assert measured_steps(record, "mistral-7b") == []
    with pytest.raises(ValueError, match="unknown sources"):
        measured_steps(record, sources=("nope",))


def test_calibration_recovers_the_factors_that_made_the_record(record):
    rep = calibrate_from_record(record, hardware=get_hardware("h200"))
    k = rep.calibration.factors
    for name in ("compute_efficiency", "attention_efficiency", "memory_efficiency", "step_overhead_s",
                 "per_sequence_overhead_s"):
        assert getattr(k, name) == pytest.approx(getattr(TRUE, name), rel=1e-3), name
    assert all(abs(pred / m.duration_s - 1) < 1e-6 for _, m, pred in rep.rows)
    assert set(rep.by_source()) == set(SOURCES)


def test_held_out_sources_are_predicted_and_reported(record):
    rep = calibrate_from_record(record, fit_sources=("prefill_chunks",), hardware="h200")
    by = rep.by_source()
    assert by["decode"]["fitted"] is False and by["prefill_chunks"]["fitted"] is True
    assert by["prefill_chunks"]["median_abs_error"] < 1e-3 and by["decode"]["steps"] == len(record["decode"])


def test_default_hardware_is_the_records_measured_ceilings(record):
    hw = record_hardware(record)
    assert hw.peak_flops_per_s == record["ceilings"]["matmul"]["flops_per_s"]
    assert hw.memory_bandwidth_bytes_per_s == record["ceilings"]["copy"]["bytes_per_s"]
    assert calibrate_from_record(record).executor.hardware.name == "h200-measured"
    with pytest.raises(ValueError, match="no model"):
        calibrate_from_record(record, model="mistral-7b")


def test_benchmark_script_prints_the_error_per_source(record, tmp_path):
    path = save_record(record, tmp_path / "h200.json")
    r = subprocess.run([sys.executable, "benchmarks/gpu_calibration.py", str(path),
                        "--fit", "prefill_chunks"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H200" in r.stdout and "held out" in r.stdout and "median |error|" in r.stdout
    r = subprocess.run([sys.executable, "benchmarks/gpu_calibration.py", str(tmp_path / "absent.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no recorded result" in r.stderr
