"""The simulator's cost model calibrated from a GPU record: predicted versus measured step times.

    .venv/bin/python benchmarks/gpu_calibration.py                      # longctx/data/gpu/h200.json
    .venv/bin/python benchmarks/gpu_calibration.py /tmp/toy.json --fit prefill_chunks,decode
    .venv/bin/python benchmarks/gpu_calibration.py REC.json --hardware h200 --json

Fits ``CostModelExecutor``'s efficiencies and overheads (``longctx.sim.calibrate``) to the record's timed
steps (prefill chunks, decode points, Exercise 1's engine steps) and prints the error per source. Sources left out of ``--fit`` are predictions on held-out steps. The default hardware is
the record's measured ceilings; ``--hardware h200`` uses the datasheet instead. Works on a toy record
made on the CPU (``python -m longctx gpu-bench --toy --out /tmp/toy.json``).
"""

from __future__ import annotations

import argparse
import json
import sys

from longctx.gpu.calibration import SOURCES, calibrate_from_record
from longctx.gpu.records import load_record, record_path


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
    p.add_argument("--hardware", default=None, help="registry GPU (h100, h200) instead of the measured ceilings")
    p.add_argument("--json", action="store_true", help="print factors and per-source errors as JSON")
    args = p.parse_args(argv)
    try:
        record = load_record(path=args.record)
        fit = tuple(s.strip() for s in args.fit.split(",") if s.strip())
        report = calibrate_from_record(record, args.model, fit, args.hardware)
    except ValueError as exc:
        sys.stderr.write(f"gpu_calibration: {exc}\n")
        return 2
    if args.json:
        k = report.calibration.factors
        print(json.dumps({"record": args.record, "device": record["device"]["name"], "date": record["date"],
                          "factors": k.__dict__, "by_source": report.by_source()}, indent=1))
    else:
        print(f"{record['device']['name']}, {record['date']}{' (toy run)' if record.get('toy') else ''}")
        print("\n".join(report_lines(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
