"""The simulator's cost model calibrated from a GPU record, and its predictions against the measurements.

Every timed step of a record is a ``longctx.sim.MeasuredStep``: each prefill chunk, each decode point
(``batch`` entries ``(1, context)``) and each engine step of Exercise 1 (these include the engine's
Python time per step; the others are device time from CUDA events). ``calibrate_from_record`` fits the
cost model's factors (``longctx.sim.calibrate``) on some sources and predicts every step. The hardware is
the record's own measured ceilings, so the fitted efficiencies say how far each kind of step falls below
what this card reaches. No torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from longctx.model.config import spec_from_dict
from longctx.sim import CostModelExecutor, MeasuredStep, calibrate
from longctx.sim.calibration import Calibration
from longctx.specs import HardwareSpec

SOURCES = ("prefill_chunks", "decode", "exercise1")


def record_hardware(record: dict) -> HardwareSpec:
    """The record's device as a ``HardwareSpec`` whose peak and bandwidth are its measured ceilings."""
    c, dev = record["ceilings"], record["device"]
    return HardwareSpec(f"{dev['key']}-measured", c["matmul"]["flops_per_s"], c["copy"]["bytes_per_s"],
                        float(dev.get("memory_bytes") or 1e9),
                        source=f"measured by longctx gpu-bench on {dev['name']}, {record['date']}")


def measured_steps(record: dict, model: str = "llama-3-8b", sources=SOURCES) -> list[tuple[str, MeasuredStep]]:
    """``(source, MeasuredStep)`` for every timed step of ``model`` in the record's ``sources``."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; allowed: {', '.join(SOURCES)}")
    rows = {s: [r for r in record.get(s, []) if r["model"] == model] for s in SOURCES[:2]}
    out = [("prefill_chunks", MeasuredStep(((n, s),), t)) for r in rows["prefill_chunks"] for n, s, t in r["chunks"]]
    out += [("decode", MeasuredStep(((1, r["context_tokens"]),) * r["batch_size"], r["step_s"]))
            for r in rows["decode"]]
    ex = record.get("exercise1") or {"model": None}
    if ex["model"] == model:
        out += [("exercise1", MeasuredStep(tuple(map(tuple, st["sequences"])), st["duration_s"]))
                for runs in ex["runs"].values() for run in runs for st in run["steps"]]
    return [(src, s) for src, s in out if src in sources]


@dataclass
class CalibrationReport:
    """Fitted factors, the calibrated ``executor`` and per step ``(source, MeasuredStep, predicted_s)``."""

    calibration: Calibration
    executor: CostModelExecutor
    fit_sources: tuple[str, ...]
    rows: list[tuple[str, MeasuredStep, float]]

    def by_source(self) -> dict[str, dict]:
        """Per source: steps, median and worst |predicted / measured - 1|, and whether it was fitted."""
        out = {}
        for src in SOURCES:
            errs = [abs(p / m.duration_s - 1) for s, m, p in self.rows if s == src]
            if errs:
                out[src] = {"steps": len(errs), "median_abs_error": statistics.median(errs),
                            "max_abs_error": max(errs), "fitted": src in self.fit_sources}
        return out


def calibrate_from_record(record: dict, model: str = "llama-3-8b", fit_sources=SOURCES,
                          hardware: HardwareSpec | str | None = None) -> CalibrationReport:
    """Fit the cost model of ``model`` (as recorded) to the steps of ``fit_sources``; predict every step.
    ``hardware`` defaults to the record's measured ceilings."""
    if model not in record["models"]:
        raise ValueError(f"the record has no model {model!r}; it has: {', '.join(record['models'])}")
    spec = spec_from_dict(record["models"][model]["config"])
    executor = CostModelExecutor(spec, hardware or record_hardware(record), weight_dtype=record["dtype"],
                                 kv_dtype=record["dtype"])
    cal = calibrate(executor, [s for _, s in measured_steps(record, model, tuple(fit_sources))])
    tuned = executor.with_factors(cal.factors)
    rows = [(src, s, tuned.step_time_s(s.sequences)) for src, s in measured_steps(record, model)]
    return CalibrationReport(cal, tuned, tuple(fit_sources), rows)
