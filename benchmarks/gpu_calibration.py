"""The simulator's cost model calibrated from a GPU record: predicted versus measured step times.

    .venv/bin/python benchmarks/gpu_calibration.py                      # longctx/data/gpu/h200.json
    .venv/bin/python benchmarks/gpu_calibration.py /tmp/toy.json --fit prefill_chunks,decode
    .venv/bin/python benchmarks/gpu_calibration.py REC.json --hardware h200 --json

Every timed step of a record is a ``longctx.sim.MeasuredStep``: each prefill chunk and each decode point
(``batch`` entries ``(1, context)``), device time from CUDA events. ``calibrate_from_record`` fits
``CostModelExecutor``'s efficiencies and overheads (``longctx.sim.calibrate``) to the steps of ``--fit`` and
predicts every step; the error per source is printed, and sources left out of ``--fit`` are predictions on
held-out steps. The default hardware is the record's measured ceilings, so the fitted efficiencies say how
far each kind of step falls below what this card reaches; ``--hardware h200`` uses the datasheet instead.
Works on a toy record made on the CPU (``python -m longctx gpu-bench --toy --out /tmp/toy.json``);
``scripts/gpu_run.sh`` (``make gpu-bench``) runs it after the suite. No torch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass

from longctx.gpu.records import load_record, record_path, row_backend
from longctx.model.config import spec_from_dict
from longctx.sim import CostModelExecutor, MeasuredStep, calibrate
from longctx.sim.calibration import Calibration
from longctx.specs import HardwareSpec

SOURCES = ("prefill_chunks", "decode")


def record_hardware(record: dict) -> HardwareSpec:
    """The record's device as a ``HardwareSpec`` whose peak and bandwidth are its measured ceilings."""
    c, dev = record["ceilings"], record["device"]
    return HardwareSpec(f"{dev['key']}-measured", c["matmul"]["flops_per_s"], c["copy"]["bytes_per_s"],
                        float(dev.get("memory_bytes") or 1e9),
                        source=f"measured by longctx gpu-bench on {dev['name']}, {record['date']}")


def measured_steps(record: dict, model: str = "llama-3-8b", sources=SOURCES,
                   backend: str = "reference") -> list[tuple[str, MeasuredStep]]:
    """``(source, MeasuredStep)`` for every timed step of ``model`` with attention ``backend`` in the record's
    ``sources`` (a record may time each point with several backends: one calibration per backend)."""
    unknown = set(sources) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; allowed: {', '.join(SOURCES)}")
    rows = {s: [r for r in record.get(s, []) if r["model"] == model and row_backend(record, r) == backend]
            for s in SOURCES}
    out = [("prefill_chunks", MeasuredStep(((n, s),), t))
           for r in rows["prefill_chunks"] for n, s, t in r["chunks"]]
    out += [("decode", MeasuredStep(((1, r["context_tokens"]),) * r["batch_size"], r["step_s"]))
            for r in rows["decode"]]
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
                          hardware: HardwareSpec | str | None = None,
                          backend: str = "reference") -> CalibrationReport:
    """Fit the cost model of ``model`` (as recorded) to the steps of ``fit_sources``; predict every step.
    ``hardware`` defaults to the record's measured ceilings."""
    if model not in record["models"]:
        raise ValueError(f"the record has no model {model!r}; it has: {', '.join(record['models'])}")
    spec = spec_from_dict(record["models"][model]["config"])
    executor = CostModelExecutor(spec, hardware or record_hardware(record), weight_dtype=record["dtype"],
                                 kv_dtype=record["dtype"])
    cal = calibrate(executor, [s for _, s in measured_steps(record, model, tuple(fit_sources), backend)])
    tuned = executor.with_factors(cal.factors)
    rows = [(src, s, tuned.step_time_s(s.sequences))
            for src, s in measured_steps(record, model, backend=backend)]
    return CalibrationReport(cal, tuned, tuple(fit_sources), rows)


def report_lines(report) -> list[str]:
    """The fitted factors, then the error per source (held-out sources are predictions)."""
    k = report.calibration.factors
    out = [f"calibrated on {', '.join(report.fit_sources)} ({report.calibration.num_steps} steps) against "
           f"{report.executor.hardware.name}: compute {k.compute_efficiency:.2f}, attention "
           f"{k.attention_efficiency:.2f}, memory {k.memory_efficiency:.2f}, step overhead "
           f"{k.step_overhead_s * 1e3:.3f} ms, per sequence {k.per_sequence_overhead_s * 1e6:.1f} us"]
    for src, s in report.by_source().items():
        out.append(f"  {src:<15} {s['steps']:>4} steps  median |error| {s['median_abs_error']:6.1%}  "
                   f"max {s['max_abs_error']:6.1%}{'' if s['fitted'] else '  (held out)'}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("record", nargs="?", default=str(record_path("h200")), help="a gpu-bench record")
    p.add_argument("--model", default="llama-3-8b", help="which recorded model to calibrate")
    p.add_argument("--fit", default=",".join(SOURCES), help=f"sources to fit on (of {','.join(SOURCES)})")
    p.add_argument("--hardware", default=None,
                   help="registry GPU (h100, h200) instead of the measured ceilings")
    p.add_argument("--backend", default="reference", help="the attention backend whose steps to calibrate on")
    p.add_argument("--json", action="store_true", help="print factors and per-source errors as JSON")
    args = p.parse_args(argv)
    try:
        record = load_record(path=args.record)
        fit = tuple(s.strip() for s in args.fit.split(",") if s.strip())
        report = calibrate_from_record(record, args.model, fit, args.hardware, args.backend)
    except ValueError as exc:
        sys.stderr.write(f"gpu_calibration: {exc}\n")
        return 2
    if args.json:
        k = report.calibration.factors
        print(json.dumps({"record": args.record, "device": record["device"]["name"], "date": record["date"],
                          "factors": k.__dict__, "by_source": report.by_source()}, indent=1))
    else:
        print(f"{record['device']['name']}, {record['date']}{' (toy run)' if record.get('toy') else ''}, "
              f"{args.backend} backend")
        print("\n".join(report_lines(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
