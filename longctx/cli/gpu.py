"""``python -m longctx gpu-bench``: measure this GPU and write ``longctx/data/gpu/<device>.json``.

    python -m longctx gpu-bench                      # the real run (CUDA, bf16, capped at 6 minutes)
    python -m longctx gpu-bench --out /tmp/h200.json --time-cap-s 300
    python -m longctx gpu-bench --toy                # the same suite on the CPU at toy sizes (seconds)

Without a CUDA device and without ``--toy`` it exits 1 with one line on stderr. Progress goes to stdout,
then a summary; ``--quiet`` prints the summary only. A point that fails is listed under ``errors`` in the
record (exit status 1); the record is written whatever happens (``*.invalid.json`` if it breaks the schema).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

NO_CUDA = ("no CUDA device: torch sees no GPU here (gpu-bench measures a real GPU); "
           "use --toy to test the harness on the CPU")


def register(subparsers) -> None:
    p = subparsers.add_parser("gpu-bench", help="measure this GPU (ceilings, prefill, decode, Exercise 1) "
                                                "and write longctx/data/gpu/<device>.json")
    p.add_argument("--toy", action="store_true", help="tiny fp32 models on the CPU (tests the harness)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="where to write the record (default: longctx/data/gpu/<device>.json; with --toy a "
                        "file in the temporary directory)")
    p.add_argument("--device-name", default=None, help="name the device in the record (default: torch's)")
    p.add_argument("--time-cap-s", type=float, default=None,
                   help="stop starting new measurements after this many seconds (default 360; toy 60)")
    p.add_argument("--sections", default=None,
                   help="comma-separated subset of: ceilings,prefill_chunks,decode,attention_share,"
                        "exercise1,slice")
    p.add_argument("--quiet", action="store_true", help="print the summary only")
    p.set_defaults(func=run_gpu_bench)


def run_gpu_bench(args: argparse.Namespace) -> int:
    from longctx import gpu

    overrides = {}
    if args.time_cap_s is not None:
        if not args.time_cap_s > 0:
            raise ValueError(f"--time-cap-s must be > 0 seconds, got {args.time_cap_s}")
        overrides["time_cap_s"] = args.time_cap_s
    if args.sections:
        overrides["sections"] = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    if not args.toy and not gpu.available():
        sys.stderr.write(NO_CUDA + "\n")
        return 1
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.stderr.write("torch is not installed: gpu-bench needs it (pip install -r requirements.txt)\n")
        return 1
    from longctx.gpu.bench import BenchConfig, run_suite, summary_lines
    from longctx.gpu.records import records_dir, save_record

    config = BenchConfig.toy(**overrides) if args.toy else BenchConfig.full(**overrides)
    log = None if args.quiet else (lambda msg: print(msg, flush=True))
    record = run_suite(config, device="cpu" if args.toy else "cuda", name=args.device_name, log=log)
    key = record["device"]["key"]
    if args.out is not None:
        out = args.out
    elif args.toy:
        out = pathlib.Path(tempfile.gettempdir()) / f"longctx-gpu-bench-{key}-toy.json"
    else:
        out = records_dir() / f"{key}.json"
    try:
        path = save_record(record, out)
    except ValueError as exc:  # keep the measurements anyway: a GPU run is too dear to lose
        bad = out.with_suffix(".invalid.json")
        bad.parent.mkdir(parents=True, exist_ok=True)
        bad.write_text(json.dumps(record, indent=1, default=str) + "\n")
        sys.stderr.write(f"the record breaks its schema ({exc}); wrote it to {bad}\n")
        return 1
    for line in summary_lines(record):
        print(line)
    print(f"wrote {path}")
    return 1 if record.get("errors") else 0
