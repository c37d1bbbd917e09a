"""CostModelExecutor: held to physics (never beats the roofline), agrees with longctx.flops, calibrates."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.engine import ChunkedPrefillScheduler, ScheduledBatch, Sequence
from longctx.flops import step_cost
from longctx.kv.block_manager import BlockManager
from longctx.sim import CostFactors, CostModelExecutor, MeasuredStep, calibrate
from longctx.specs import HARDWARE, MODELS, get_hardware

entries = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 32768)), min_size=1, max_size=40)
factors = st.builds(
    CostFactors, compute_efficiency=st.floats(0.05, 1.0), attention_efficiency=st.floats(0.05, 1.0),
    memory_efficiency=st.floats(0.05, 1.0), step_overhead_s=st.floats(0.0, 0.01),
    per_sequence_overhead_s=st.floats(0.0, 1e-4),
)
gpu_model = st.tuples(st.sampled_from(sorted(MODELS)), st.sampled_from(sorted(HARDWARE)))


@settings(max_examples=200, deadline=None)
@given(entries, factors, gpu_model)
def test_no_step_beats_the_roofline(seqs, k, names):
    model, gpu = names
    ex = CostModelExecutor(model, gpu, k)
    hw = get_hardware(gpu)
    cost = step_cost(model, seqs)  # the same conventions as the cost model (causal, "matmul")
    t = ex.step_time_s(seqs)
    assert t >= cost.weight_bytes / hw.memory_bandwidth_bytes_per_s * (1 - 1e-12)  # weights must be read
    assert t >= cost.bytes / hw.memory_bandwidth_bytes_per_s * (1 - 1e-12)
    assert t >= cost.flops / hw.peak_flops_per_s * (1 - 1e-12)  # cannot exceed peak FLOP/s


@settings(max_examples=100, deadline=None)
@given(entries, gpu_model)
def test_ideal_factors_are_exactly_the_roofline(seqs, names):
    model, gpu = names
    hw = get_hardware(gpu)
    cost = step_cost(model, seqs)  # the same conventions as the cost model (causal, "matmul")
    t = CostModelExecutor(model, gpu, CostFactors.ideal(), form="batch").step_time_s(seqs)
    expect = max(cost.flops / hw.peak_flops_per_s, cost.bytes / hw.memory_bandwidth_bytes_per_s)
    assert t == pytest.approx(expect, rel=1e-9)


def test_decode_step_is_weight_bandwidth_bound_on_h100():
    ex = CostModelExecutor("llama-3-8b", "h100", CostFactors.ideal())
    t = ex.step_time_s([(1, 100)])
    streamed = MODELS["llama-3-8b"].num_params - 128256 * 4096  # the input embedding is looked up, not read
    assert t == pytest.approx(streamed * 2 / 3.35e12, rel=0.01)  # ~4.5 ms
    assert ex.breakdown([(1, 100)]).bound == "memory"
    assert ex.breakdown([(8192, 0)]).bound == "compute"


def test_execute_reads_batch_before_the_step():
    seq = Sequence(0, [0] * 100, max_tokens=4)
    seq.num_computed_tokens = 60
    batch = ScheduledBatch(BlockManager(16, 16))
    batch.add(seq, 40)
    ex = CostModelExecutor("llama-3-8b", "h100")
    r = ex.execute(batch)
    assert r.next_token_ids is None
    assert r.duration_s == pytest.approx(ex.step_time_s([(40, 60)]))


@pytest.mark.parametrize("bad", [{"compute_efficiency": 0.0}, {"memory_efficiency": 1.5},
                                 {"step_overhead_s": -1.0}, {"per_sequence_overhead_s": math.inf}])
def test_factors_validate(bad):
    with pytest.raises(ValueError):
        CostFactors(**bad)


def _synthetic_steps(ex, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(120):
        kind = rng.integers(3)
        if kind == 0:  # pure decode batches (memory bound)
            seqs = [(1, int(rng.integers(10, 8000))) for _ in range(int(rng.integers(1, 64)))]
        elif kind == 1:  # prefill chunks (compute bound)
            seqs = [(int(rng.integers(256, 4096)), int(rng.integers(0, 8000)))]
        else:  # mixed
            seqs = [(1, int(rng.integers(10, 4000)))] * int(rng.integers(1, 32))
            seqs = seqs + [(int(rng.integers(64, 2048)), int(rng.integers(0, 20000)))]
        steps.append(MeasuredStep(tuple(seqs), ex.step_time_s(seqs)))
    return steps


def test_calibration_recovers_known_factors():
    truth = CostFactors(compute_efficiency=0.55, attention_efficiency=0.35, memory_efficiency=0.7,
                        step_overhead_s=2e-3, per_sequence_overhead_s=2e-5)
    true_ex = CostModelExecutor("llama-3-8b", "h100", truth)
    steps = _synthetic_steps(true_ex)
    cal = calibrate(CostModelExecutor("llama-3-8b", "h100"), steps)
    for name in ("compute_efficiency", "attention_efficiency", "memory_efficiency", "step_overhead_s",
                 "per_sequence_overhead_s"):
        assert getattr(cal.factors, name) == pytest.approx(getattr(truth, name), rel=0.02, abs=1e-7), name
    assert cal.max_abs_rel_error < 1e-3


def test_calibration_holds_unfitted_factors_and_checks_input():
    ex = CostModelExecutor("llama-3-8b", "h100", CostFactors(memory_efficiency=0.9))
    steps = _synthetic_steps(ex)
    cal = calibrate(ex, steps, fit=("step_overhead_s", "compute_efficiency"))
    assert cal.factors.memory_efficiency == 0.9
    with pytest.raises(ValueError, match="unknown factor"):
        calibrate(ex, steps, fit=("speed",))
    with pytest.raises(ValueError, match="at least 2"):
        calibrate(ex, steps[:1])


def test_engine_runs_with_cost_model_on_virtual_clock():
    from longctx.sim import build_sim_engine

    eng = build_sim_engine(ChunkedPrefillScheduler(256), "llama-3-8b", "h100")
    seq = eng.add_request([0] * 1000, 5, arrival_s=0.0)
    eng.run_until_done()
    assert len(seq.token_times_s) == 5 and seq.ttft_s > 0
    assert eng.history[-1].end_s == pytest.approx(sum(r.duration_s for r in eng.history))


@pytest.mark.parametrize("sms", [132, 108])
def test_the_step_fits_design_row_is_the_operator_forms_step_time(sms):
    """``step_terms.design_row`` (what fitting on measured steps solves) prices a step exactly as
    ``step_time_s`` does, whatever ``gemm_wave_sms`` the factors carry (an A100 has 108 SMs)."""
    import dataclasses

    import numpy as np

    from longctx.sim.step_terms import design_row, operator_terms

    ex = CostModelExecutor("llama-3-8b", "h100")
    ex = ex.with_factors(dataclasses.replace(ex.factors, gemm_wave_sms=sms))
    k = ex.factors
    theta = np.array([k.step_overhead_s, k.per_sequence_overhead_s, 1 / k.compute_efficiency,
                      1 / k.attention_efficiency, 1 / k.memory_efficiency])
    for seqs in ([(1, 100)] * 8, [(512, 0)], [(300, 2000), (1, 500), (1, 900)], [(4096, 4096)]):
        row, const = design_row(operator_terms(ex, seqs), theta, k.serial_fraction)
        assert float(row @ theta + const) == pytest.approx(ex.step_time_s(seqs), rel=1e-9), seqs
