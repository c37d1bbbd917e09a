"""The GPU suite's preflight on the CPU: sizes planned from fake free-memory numbers (an H100 80 GB runs every
section, an H200 the full sizes, a small card a few layers), and a fused kernel that fails becoming one
recorded line while the run goes on with the reference backend."""

import json

import pytest
import torch

from longctx.__main__ import main
from longctx.gpu import preflight as pf
from longctx.gpu.records import check_record
from longctx.gpu.suite import BenchConfig, run_suite
from longctx.kv.quant import pool_bytes_per_token
from longctx.memory import kv_bytes_per_token
from longctx.specs import dtype_bytes

GIB = 2**30
H100_FREE = 79.0 * GIB  # an H100 80 GB: 81,559 MiB in all, a little under 80 GiB free before the run
H200_FREE = 139.5 * GIB


def _fits(c, free):
    """Every section's largest allocation, with the weights, within what the plan calls usable."""
    spec, usable = c.model_spec(), pf.usable_bytes(free)
    weights = spec.num_params * dtype_bytes(c.dtype)
    per_token = kv_bytes_per_token(spec, c.dtype)
    decode = max((b * L for L in c.decode_contexts for b in c.decode_batch_sizes
                  if b * L <= c.max_decode_kv_tokens), default=0) * per_token
    capstone = max(pf.capstone_pool_tokens(c, c.capstone_users_for(kv))
                   * (per_token if kv == c.dtype else pool_bytes_per_token(spec, kv))
                   for kv in c.capstone_kv_dtypes)
    stall = max(pf.stall_pool_tokens(c, L) for L in c.stall_long_prompts) * per_token
    return weights + max(decode, capstone, stall) <= usable


def test_an_h100_80gb_runs_every_section_the_bf16_capstone_with_fewer_users():
    c, notes = pf.plan_sizes(BenchConfig(), H100_FREE)
    assert c.num_layers is None and c.model_spec().num_layers == 32  # the whole model
    fitting = [(b, L) for L in c.decode_contexts for b in c.decode_batch_sizes
               if b * L <= c.max_decode_kv_tokens]
    assert {(32, 4096), (64, 4096), (128, 2048), (32, 8192)} <= set(fitting)  # the target's decode points
    assert all(b * L <= c.max_decode_kv_tokens for b, L in c.decode_profile_points)  # the whole profile
    users = dict(c.capstone_users_by_kv)
    assert users["fp8"] == 64 and 32 <= users["bf16"] < 64  # 64 x 8K resident in fp8, as the course says
    assert c.stall_long_prompts == (8192, 32768) and max(c.attention_contexts) == 131072
    assert any(n.startswith("capstone kv bf16:") for n in notes)
    assert any(n.startswith("decode:") for n in notes)
    assert _fits(c, H100_FREE)


def test_an_h200_runs_the_full_sizes_and_shrinks_nothing():
    c, notes = pf.plan_sizes(BenchConfig(), H200_FREE)
    assert notes == [] and c.max_decode_kv_tokens == BenchConfig().max_decode_kv_tokens
    assert dict(c.capstone_users_by_kv) == {"bf16": 64, "fp8": 64} and _fits(c, H200_FREE)


@pytest.mark.parametrize("free_gib", [7.5, 10, 14.7, 22, 40, 47, 94])
def test_a_smaller_card_runs_every_section_at_sizes_that_fit(free_gib):
    base = BenchConfig(dtype="fp16", capstone_kv_dtypes=("fp16", "fp8"))
    c, notes = pf.plan_sizes(base, free_gib * GIB)
    assert c.model_spec().num_layers >= 1 and _fits(c, free_gib * GIB)
    assert any(b * L <= c.max_decode_kv_tokens for L in c.decode_contexts for b in c.decode_batch_sizes)
    assert c.stall_long_prompts and c.attention_contexts and min(dict(c.capstone_users_by_kv).values()) >= 1
    if free_gib < 40:  # the 8B model's 15 GiB of weights take over half of what is usable: fewer layers
        assert c.num_layers < 32 and notes[0].startswith(f"model: {c.num_layers} of 32 layers")


def test_quick_sizes_fit_a_free_notebook_t4():
    c, _ = pf.plan_sizes(BenchConfig.quick(dtype="fp16", capstone_kv_dtypes=("fp16", "fp8")), 14.7 * GIB)
    assert c.is_quick and c.time_cap_s <= 300 and _fits(c, 14.7 * GIB)
    assert dict(c.capstone_users_by_kv) == {"fp16": 16, "fp8": 16}


def test_the_fused_kernels_run_eagerly_on_a_cpu():
    assert pf.check_kernels("cpu", torch.float32) == []


def _failing(device, dtype):
    return ["FlexAttention decode: BackendCompilerFailed: backend='inductor' raised: no C compiler"]


def test_a_failing_fused_kernel_falls_back_to_the_reference_backend_in_one_line(monkeypatch):
    monkeypatch.setattr(pf, "check_kernels", _failing)
    c, report = pf.preflight(BenchConfig.toy(serving_backend="fused"), "cpu")
    assert c.attention_backends == ("reference",) and c.serving_backend == "reference"
    assert c.cuda_graphs == "off" and report["cuda_graphs"] == "off: the fused kernels failed"
    assert report["fallbacks"] == ["fused backend: FlexAttention decode: BackendCompilerFailed: backend="
                                   "'inductor' raised: no C compiler -> the reference backend runs instead "
                                   "(no fused rows, no decode graphs)"]
    assert report["free_bytes"] is None and report["shrunk"] == []  # a CPU: nothing sized


def test_the_run_goes_on_and_exits_0_when_the_fused_kernels_fail(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pf, "check_kernels", _failing)
    out = tmp_path / "rec.json"
    assert main(["gpu-bench", "--toy", "--sections", "decode,decode_profile", "--time-cap-s", "300",
                 "--out", str(out)]) == 0
    rec = check_record(json.loads(out.read_text()))
    assert rec["errors"] == [] and rec["fallbacks"][0].startswith("fused backend: FlexAttention decode:")
    assert {r["attention_backend"] for r in rec["decode"] + rec["decode_profile"]} == {"reference"}
    assert "flex_decode" not in rec
    assert "FALLBACKS 1: fused backend" in capsys.readouterr().out  # the summary marks what is missing


def test_free_memory_given_to_the_suite_is_planned_and_recorded():
    rec = run_suite(BenchConfig.toy(sections=("ceilings",)), device="cpu", free_bytes=H100_FREE)
    assert rec["preflight"]["free_bytes"] == H100_FREE and rec["preflight"]["shrunk"] == []
    assert rec["preflight"]["usable_bytes"] == pytest.approx(pf.usable_bytes(H100_FREE))
    assert dict(rec["config"]["capstone_users_by_kv"]) == {"fp32": 4, "fp8": 4}


def test_a_failed_graph_capture_in_the_engine_sections_is_a_fallback_line(monkeypatch):
    from longctx.engine import cuda_graphs
    from longctx.gpu import serving_sections

    def failing_capture(executor, mode="auto", max_batch=256, capture=None):
        decided = cuda_graphs.attach_decode_graphs(executor, mode, max_batch, capture=False)
        if executor.decode_graphs is not None:
            executor.decode_graphs.capture = True  # no CUDA here: the capture fails
        return decided

    monkeypatch.setattr(serving_sections, "attach_decode_graphs", failing_capture)
    rec = run_suite(BenchConfig.toy(sections=("stall",), serving_backend="fused", stall_repeats=1,
                                    stall_long_prompts=(128,), time_cap_s=600), device="cpu")
    assert rec["errors"] == [] and len(rec["stall"]) == 3
    (line,) = rec["fallbacks"]  # warmed largest bucket first: the decoders' 4
    assert line.startswith("cuda graphs: capture of bucket 4 failed: ")
    assert line.endswith("; eager decode steps instead") and "\n" not in line
    assert all(r["cuda_graphs"]["ran"] == "off" and r["attention_backend"] == "fused" for r in rec["stall"])


def test_a_card_too_small_for_one_layer_says_so_in_one_line():
    c, notes = pf.plan_sizes(BenchConfig(), 4 * GIB)
    assert c.num_layers == 1 and notes[0].startswith("model: even 1 layer's weights (2.4 GiB) take over half")
