"""A small GPU record for tests, every time made by the cost model with known factors (no GPU needed)."""

from __future__ import annotations

from longctx.flops import step_cost
from longctx.gpu.records import SCHEMA
from longctx.model.config import LLAMA3_8B, spec_to_dict
from longctx.sim import CostFactors, CostModelExecutor
from longctx.specs import get_hardware


def small_record(factors: CostFactors | None = None, gpu: str = "h200") -> dict:
    """A record of Llama-3-8B on ``gpu`` (datasheet ceilings) whose times are the cost model's."""
    hw = get_hardware(gpu)
    ex = CostModelExecutor(LLAMA3_8B, hw, factors or CostFactors())
    prefill = []
    for chunk in (128, 1024, 4096):
        chunks = [[chunk, s, ex.step_time_s([(chunk, s)])] for s in range(0, 8192, chunk)]
        flops = sum(step_cost(LLAMA3_8B, [(n, s)]).flops for n, s, _ in chunks)
        total = sum(t for *_, t in chunks)
        prefill.append({"model": "llama-3-8b", "chunk_size": chunk, "prompt_tokens": 8192, "time_s": total,
                        "flops": flops, "flops_per_s": flops / total, "chunks": chunks})
    decode = []
    for b in (1, 16, 64):
        for L in (1024, 4096):
            t, cost = ex.step_time_s([(1, L)] * b), step_cost(LLAMA3_8B, [(1, L)] * b)
            decode.append({"model": "llama-3-8b", "batch_size": b, "context_tokens": L, "step_s": t,
                           "bytes": cost.bytes, "bytes_per_s": cost.bytes / t, "flops": cost.flops})
    share = [{"model": "llama-3-8b", "context_tokens": T, "attention_s": a, "rest_s": 1.0,
              "attention_share": a / (a + 1.0), "flop_share": f}
             for T, a, f in ((1024, 0.02, 0.05), (65536, 2.0, 0.6))]
    return {"schema": SCHEMA, "date": "2026-01-01T00:00:00+00:00", "toy": False, "dtype": "bf16",
            "device": {"name": f"NVIDIA {gpu.upper()}", "key": gpu, "torch": "test", "cuda": None,
                       "driver": None},
            "models": {"llama-3-8b": {"config": spec_to_dict(LLAMA3_8B)}},
            "ceilings": {"matmul": {"n": 8192, "flops_per_s": hw.peak_flops_per_s, "median_s": 1e-3},
                         "copy": {"bytes": 2**32, "bytes_per_s": hw.memory_bandwidth_bytes_per_s,
                                  "median_s": 1e-3}},
            "prefill_chunks": prefill, "decode": decode, "attention_share": share, "errors": [],
            "skipped": []}
