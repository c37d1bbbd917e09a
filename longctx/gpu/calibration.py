"""The simulator's cost model calibrated from a GPU record, and its predictions against the measurements.

Every timed step of a record becomes a ``longctx.sim.MeasuredStep`` ``((new, cached), ...) -> seconds``:
each prefill chunk (``prefill_chunks``), each decode point (``decode``: ``batch`` entries ``(1, context)``)
and each engine step of Exercise 1 (``exercise1``; these include the engine's Python time per step, the
others are device time from CUDA events). ``calibrate_from_record`` fits ``CostModelExecutor``'s factors
(``longctx.sim.calibrate``) on some sources and reports predicted versus measured for all of them.

The hardware is the record's own measured ceilings (matmul FLOP/s, copy bytes/s), so the fitted
efficiencies say how far each kind of step falls below what this card really reaches, not below the
datasheet. Pure Python + numpy (no torch).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from longctx.gpu.counts import registry_spec
from longctx.model.config import spec_from_dict, spec_to_dict
from longctx.sim.cost_model import Calibration, CostModelExecutor, MeasuredStep, calibrate
from longctx.specs import HardwareSpec

SOURCES = ("prefill_chunks", "decode", "exercise1")
WEIGHT_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def record_hardware(record: dict) -> HardwareSpec:
    """The record's device as a ``HardwareSpec`` whose peak and bandwidth are its measured ceilings."""
    c, dev = record["ceilings"], record["device"]
    return HardwareSpec(f"{dev['key']}-measured", c["matmul"]["flops_per_s"], c["copy"]["bytes_per_s"],
                        float(dev.get("memory_bytes") or 1e9),
                        source=f"measured by longctx gpu-bench on {dev['name']}, {record['date']}: "
                               f"{c['matmul'].get('n')}^3 matmul, {c['copy'].get('bytes')}-byte copy")


def measured_steps(record: dict, model: str = "llama-3-8b", sources=SOURCES) -> list[tuple[str, MeasuredStep]]:
    """``(source, MeasuredStep)`` for every timed step of ``model`` in the record's ``sources``."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; allowed: {', '.join(SOURCES)}")
    out = []
    if "prefill_chunks" in sources:
        for row in record.get("prefill_chunks", []):
            if row["model"] == model:
                out += [("prefill_chunks", MeasuredStep(((n, s),), t)) for n, s, t in row["chunks"]]
    if "decode" in sources:
        for row in record.get("decode", []):
            if row["model"] == model:
                seqs = ((1, row["context_tokens"]),) * row["batch_size"]
                out.append(("decode", MeasuredStep(seqs, row["step_s"])))
    ex = record.get("exercise1")
    if "exercise1" in sources and ex and ex["model"] == model:
        for run in ex["runs"].values():
            out += [("exercise1", MeasuredStep(tuple(tuple(p) for p in st["sequences"]), st["duration_s"]))
                    for st in run["steps"]]
    return out


@dataclass
class CalibrationReport:
    """Fitted factors (``calibration``), the calibrated ``executor`` and one row per measured step:
    ``{"source", "sequences", "measured_s", "predicted_s", "error"}`` (error = predicted / measured - 1)."""

    calibration: Calibration
    executor: CostModelExecutor
    fit_sources: tuple[str, ...]
    rows: list[dict] = field(repr=False)

    def by_source(self) -> dict[str, dict]:
        """Per source: number of steps, median and worst absolute relative error."""
        out = {}
        for src in SOURCES:
            errs = [abs(r["error"]) for r in self.rows if r["source"] == src]
            if errs:
                out[src] = {"steps": len(errs), "median_abs_error": statistics.median(errs),
                            "max_abs_error": max(errs), "fitted": src in self.fit_sources}
        return out

    def lines(self, max_rows: int = 12) -> list[str]:
        """A printable summary: the factors, the error per source, and a sample of steps."""
        k = self.calibration.factors
        out = [f"calibrated on {', '.join(self.fit_sources)} ({self.calibration.num_steps} steps) against "
               f"{self.executor.hardware.name}: compute {k.compute_efficiency:.2f}, attention "
               f"{k.attention_efficiency:.2f}, memory {k.memory_efficiency:.2f}, step overhead "
               f"{k.step_overhead_s * 1e3:.3f} ms, per sequence {k.per_sequence_overhead_s * 1e6:.1f} us"]
        for src, s in self.by_source().items():
            out.append(f"  {src:<15} {s['steps']:>4} steps  median |error| {s['median_abs_error']:6.1%}  "
                       f"max {s['max_abs_error']:6.1%}{'' if s['fitted'] else '  (held out)'}")
        out.append(f"  {'source':<15}{'step':<28}{'measured ms':>12}{'predicted ms':>14}{'error':>8}")
        step = max(1, len(self.rows) // max_rows)
        for r in self.rows[::step][:max_rows]:
            seqs = r["sequences"]
            desc = (f"{len(seqs)} x (1, {seqs[0][1]})" if all(n == 1 for n, _ in seqs)
                    else f"{len(seqs)} entries, {sum(n for n, _ in seqs)} new")
            out.append(f"  {r['source']:<15}{desc:<28}{r['measured_s'] * 1e3:>12.3f}{r['predicted_s'] * 1e3:>14.3f}"
                       f"{r['error']:>8.1%}")
        return out


def calibrate_from_record(record: dict, model: str = "llama-3-8b", fit_sources=SOURCES,
                          hardware: HardwareSpec | str | None = None) -> CalibrationReport:
    """Fit the cost model of ``model`` (as recorded) to the record's steps from ``fit_sources``; predict
    every step of every source. ``hardware`` defaults to the record's measured ceilings."""
    if model not in record.get("models", {}):
        raise ValueError(f"the record has no model {model!r}; it has: {', '.join(record.get('models', {}))}")
    spec = registry_spec(model, spec_from_dict(record["models"][model]["config"]))
    hw = record_hardware(record) if hardware is None else hardware
    dtype = WEIGHT_DTYPES.get(record.get("dtype", "bfloat16"), "bf16")
    executor = CostModelExecutor(spec, hw, weight_dtype=dtype, kv_dtype=dtype)
    fit = [s for _, s in measured_steps(record, model, tuple(fit_sources))]
    cal = calibrate(executor, fit)
    tuned = executor.with_factors(cal.factors)
    rows = []
    for src, s in measured_steps(record, model):
        pred = tuned.step_time_s(s.sequences)
        rows.append({"source": src, "sequences": [list(p) for p in s.sequences], "measured_s": s.duration_s,
                     "predicted_s": pred, "error": pred / s.duration_s - 1})
    return CalibrationReport(cal, tuned, tuple(fit_sources), rows)


def synthetic_record(factors=None, hardware: str = "h200", date: str = "2026-01-01T00:00:00+00:00") -> dict:
    """A valid record at Llama-3-8B shape whose every time is the cost model's prediction with ``factors``
    on ``hardware`` (datasheet ceilings): for tests and examples of calibration, never for lessons."""
    from longctx.gpu import counts
    from longctx.gpu.records import SCHEMA
    from longctx.model.config import LLAMA3_8B
    from longctx.sim.cost_model import CostFactors
    from longctx.specs import get_hardware

    hw = get_hardware(hardware)
    ex = CostModelExecutor("llama-3-8b", hw, factors or CostFactors())
    cfg = LLAMA3_8B
    prefill = []
    for chunk in (128, 1024, 4096):
        pieces = [(chunk, s) for s in range(0, 8192, chunk)]
        chunks = [[n, s, ex.step_time_s([(n, s)])] for n, s in pieces]
        f = counts.executed_flops(cfg, pieces, len(pieces))
        total = sum(t for *_, t in chunks)
        prefill.append({"model": "llama-3-8b", "chunk_size": chunk, "prompt_tokens": 8192, "time_s": total,
                        **f, "flops_per_s": f["flops"] / total, "chunks": chunks})
    decode = []
    for b in (1, 16, 64):
        for L in (1024, 4096):
            seqs = [(1, L)] * b
            t, nbytes = ex.step_time_s(seqs), counts.min_step_bytes(cfg, seqs, 2)
            decode.append({"model": "llama-3-8b", "batch_size": b, "context_tokens": L, "step_s": t,
                           "bytes": nbytes, "bytes_per_s": nbytes / t})
    steps, t0 = [], 1.0
    for k in range(6):
        seqs = [[1, 1024 + k]] * 4 + ([[512, 512 * k]] if k < 4 else [])
        d = ex.step_time_s([tuple(p) for p in seqs])
        steps.append({"sequences": seqs, "start_s": t0, "end_s": t0 + d, "duration_s": d})
        t0 += d
    times = [[1.0] + [st["end_s"] for st in steps]] * 4
    itl = [b - a for t in times for a, b in zip(t, t[1:], strict=False)]
    run = {"scheduler": "chunked-512", "ttft_s": [steps[3]["end_s"] - 1.0], "itl_s": itl, "steps": steps,
           "arrival_s": 1.0, "stream_token_times_s": times, "ttft_median_s": steps[3]["end_s"] - 1.0,
           "itl_p50_s": sorted(itl)[len(itl) // 2], "itl_p99_s": max(itl), "max_itl_s": max(itl),
           "steady_itl_s": min(itl)}
    return {
        "schema": SCHEMA, "date": date, "toy": False, "dtype": "bfloat16", "synthetic": True,
        "device": {"name": f"NVIDIA {hw.name.upper()}", "key": hw.name, "torch": "synthetic", "cuda": None,
                   "driver": None, "memory_bytes": hw.memory_bytes},
        "models": {"llama-3-8b": {"config": spec_to_dict(cfg)}},
        "ceilings": {"matmul": {"n": 8192, "median_s": 2 * 8192**3 / hw.peak_flops_per_s,
                                "flops_per_s": hw.peak_flops_per_s},
                     "copy": {"bytes": 2**32, "median_s": 2**33 / hw.memory_bandwidth_bytes_per_s,
                              "bytes_per_s": hw.memory_bandwidth_bytes_per_s}},
        "prefill_chunks": prefill, "decode": decode, "attention_share": [],
        "exercise1": {"model": "llama-3-8b", "num_decode_streams": 4, "prompt_tokens": 2048,
                      "stream_context_tokens": 1024, "runs": {"chunked-512": run}},
        "skipped": [], "wall_s": 1.0,
    }
