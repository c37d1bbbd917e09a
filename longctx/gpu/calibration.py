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
from longctx.model.config import LlamaConfig
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
    spec = registry_spec(model, LlamaConfig.from_dict(record["models"][model]["config"]))
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
