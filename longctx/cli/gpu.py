"""``python -m longctx gpu-bench``: measure this GPU and write ``longctx/data/gpu/<device>.json``.

    python -m longctx gpu-bench                      # the real run (CUDA, bf16; no point starts after 400 s)
    python -m longctx gpu-bench --out /tmp/h100.json --time-cap-s 300
    python -m longctx gpu-bench --quick              # a learner's own GPU: every section, <= ~5 minutes
    python -m longctx gpu-bench --toy                # the same suite on the CPU at toy sizes (seconds)

Without a CUDA device and without ``--toy`` it exits 1 with one line on stderr. Progress goes to stdout,
then a summary; ``--quiet`` prints the summary only. What the card cannot run as asked (no bf16, no compiler
for the fused kernels, a pool that does not fit, a failed graph capture) is one line under ``fallbacks`` and
the run goes on (exit status 0); a point that fails otherwise is listed under ``errors`` (exit status 1). The
record is written whatever happens.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

NO_CUDA = ("no CUDA device: torch sees no GPU here (gpu-bench measures a real GPU); "
           "use --toy to test the harness on the CPU")


def register(subparsers) -> None:
    p = subparsers.add_parser("gpu-bench", help="measure this GPU (ceilings, prefill, decode with and "
                                                "without CUDA graphs, a decode-step profile, attention "
                                                "share, prefill, the stall and the capstone through the "
                                                "engine) and write longctx/data/gpu/<device>.json")
    p.add_argument("--toy", action="store_true", help="tiny fp32 models on the CPU (tests the harness)")
    p.add_argument("--quick", action="store_true",
                   help="a small card in a few minutes (every section, fewer points; default out: "
                        "longctx/data/gpu/<device>-quick.json)")
    p.add_argument("--cuda-graphs", default=None, metavar="{auto,off}",
                   help="replay decode-only steps of the fused backend from CUDA graphs (default auto: on "
                        "CUDA when the fused backend runs)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="where to write the record (default: longctx/data/gpu/<device>.json; with --toy a "
                        "file in the temporary directory)")
    p.add_argument("--time-cap-s", type=float, default=None,
                   help="stop starting new measurements after this many seconds "
                        "(default 400; toy 60; quick 240)")
    p.add_argument("--sections", default=None,
                   help="comma-separated subset of: "
                        "ceilings,prefill_chunks,decode,decode_profile,attention_share,prefill_engine,stall,"
                        "capstone")
    p.add_argument("--attention-backends", default=None,
                   help="backends timed side by side in prefill_chunks and decode (default reference,fused)")
    p.add_argument("--attention-backend", default=None,
                   help="auto, reference or fused: the engine's backend in stall and capstone (default auto: "
                        "fused on CUDA in bf16 with a pool in the model's dtype, else reference; an fp8 "
                        "pool runs the reference)")
    p.add_argument("--quiet", action="store_true", help="print the summary only")
    p.set_defaults(func=run_gpu_bench)


def run_gpu_bench(args: argparse.Namespace) -> int:
    overrides = {}
    if args.time_cap_s is not None:
        if not args.time_cap_s > 0:
            raise ValueError(f"--time-cap-s must be > 0 seconds, got {args.time_cap_s}")
        overrides["time_cap_s"] = args.time_cap_s
    if args.sections:
        overrides["sections"] = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    if args.attention_backends:
        overrides["attention_backends"] = tuple(s.strip() for s in args.attention_backends.split(",")
                                                if s.strip())
    if args.attention_backend:
        overrides["serving_backend"] = args.attention_backend
    if args.cuda_graphs:
        overrides["cuda_graphs"] = args.cuda_graphs
    if args.toy and args.quick:
        raise ValueError("--toy and --quick are two sizes of the run: give one")
    try:
        import torch
    except ImportError:
        sys.stderr.write("torch is not installed: gpu-bench needs it (pip install -r requirements.txt)\n")
        return 1
    if not args.toy and not torch.cuda.is_available():
        sys.stderr.write(NO_CUDA + "\n")
        return 1
    from longctx.gpu.records import record_path, save_record
    from longctx.gpu.suite import BenchConfig, run_suite
    from longctx.provenance import device_key

    config = (BenchConfig.toy(**overrides) if args.toy else BenchConfig.quick(**overrides) if args.quick
              else BenchConfig(**overrides))
    log = None if args.quiet else (lambda msg: print(msg, flush=True))
    device = "cpu" if args.toy else "cuda"
    key = "cpu" if args.toy else device_key(torch.cuda.get_device_name(0))  # the record's device.key
    key += "-quick" if args.quick else ""
    if args.out is not None:
        out = args.out
    elif args.toy:
        out = pathlib.Path(tempfile.gettempdir()) / f"longctx-gpu-bench-{key}-toy.json"
    else:
        out = record_path(key)
    record = run_suite(config, device=device, log=log, checkpoint=lambda partial: save_record(partial, out))
    path = save_record(record, out)
    for line in summary_lines(record):
        print(line)
    print(f"wrote {path}")
    return 1 if record["errors"] else 0


def summary_lines(record: dict) -> list[str]:
    """A few lines a person reads after the run: the ceilings and each curve's points."""
    from longctx.gpu.records import provenance, row_backend

    c, d = record["ceilings"], record["device"]
    lines = [f"{provenance(record)}: torch {d['torch']}, CUDA {d['cuda']}, driver {d['driver']}, "
             f"{record['wall_s']:.0f} s",
             f"ceilings: matmul {c['matmul']['flops_per_s'] / 1e12:.1f} TFLOP/s (n={c['matmul']['n']}), "
             f"copy {c['copy']['bytes_per_s'] / 1e12:.2f} TB/s (read + written)"]
    lines += [f"prefill {r['model']} chunk {r['chunk_size']:>5} {row_backend(record, r):<9}: "
              f"{r['time_s'] * 1e3:9.2f} ms for {r['prompt_tokens']} tokens, "
              f"{r['flops_per_s'] / 1e12:7.2f} TFLOP/s"
              for r in record.get("prefill_chunks", [])]
    for backend in dict.fromkeys(row_backend(record, r) for r in record.get("decode", [])):
        rows = [r for r in record["decode"] if row_backend(record, r) == backend]
        best = max(rows, key=lambda r: r["bytes_per_s"])
        big = [r["bytes_per_s"] for r in rows if r["batch_size"] >= 32 and r["context_tokens"] >= 4096]
        target = f"; at batch >= 32, context >= 4K up to {max(big) / c['copy']['bytes_per_s']:.0%} of copy" \
            if big else ""
        lines.append(f"decode {backend}: {len(rows)} points; best {best['bytes_per_s'] / 1e12:.2f} TB/s "
                     f"at batch {best['batch_size']} context {best['context_tokens']} ({best['model']})"
                     + target)
    if (pre := record.get("preflight")) is not None:
        asked = record.get("config", {}).get("cuda_graphs", "auto")
        lines.append(f"cuda graphs ({asked}): {pre['cuda_graphs']}")
    lines += serving_lines(record)
    lines += profile_lines(record)
    lines += [f"layer {r['model']} T={r['context_tokens']:>6}: attention {r['attention_share']:5.1%} of time "
              f"({r['flop_share']:5.1%} of FLOPs)" for r in record.get("attention_share", [])]
    for key in ("fallbacks", "errors", "skipped"):
        if record.get(key):
            lines.append(f"{key.upper()} {len(record[key])}: " + "; ".join(record[key][:6])
                         + (" ..." if len(record[key]) > 6 else ""))
    return lines


def serving_lines(record: dict) -> list[str]:
    """One line per stall cell (medians over its runs, the worst gap's range) and per capstone run."""
    from longctx.gpu.records import stall_cell

    lines = []
    for r in record.get("stall", []):
        s, label = stall_cell(r), ("monolithic" if r["token_budget"] is None
                                   else f"chunked-{r['token_budget']}")
        lines.append(f"stall {r['long_prompt']:>6} {label:<13} {r['attention_backend']}, n={r['n']}: TTFT "
                     f"{s['ttft_s']['median']:.3f} s, worst gap {s['worst_gap_s']['median'] * 1e3:.1f} ms "
                     f"({s['worst_gap_s']['min'] * 1e3:.1f}-{s['worst_gap_s']['max'] * 1e3:.1f}), "
                     f"P99 {s['p99_gap_s']['median'] * 1e3:.1f} ms")
    for r in record.get("capstone", []):
        mem = "" if r["gpu_mem_peak_gib"] is None else f", peak {r['gpu_mem_peak_gib']:.1f} GiB"
        walls = [run["wall_s"] for run in r.get("runs", [])] or [r["wall_s"]]
        lines.append(f"capstone {r['users']} x {r['prompt']} kv {r['kv_dtype']} {r['attention_backend']}, "
                     f"n={r['n']}: {r['wall_s']:.1f} s ({min(walls):.1f}-{max(walls):.1f}), "
                     f"{r['pool_blocks']} blocks{mem}, "
                     f"peak resident {r['peak_resident']}, "
                     f"TTFT median {r['ttft_median_s']:.2f} s, ITL median {r['itl_median_s'] * 1e3:.1f} ms")
    return lines


def profile_lines(record: dict) -> list[str]:
    """The decode-step profile (host vs GPU vs wall), the FlexAttention kernel alone, and the engine's
    prefill: one line per row."""
    lines = []
    for r in record.get("decode_profile", []):
        graphs = "" if r["cuda_graphs"] == "off" else f"+graphs ({r['cuda_graphs']})"
        gpu = ("GPU time absent (no GPU)" if r["gpu_s"] is None
               else f"GPU {r['gpu_s'] * 1e3:.2f} ms: {r['bound']}-bound")
        lines.append(f"decode profile b={r['batch_size']} L={r['context_tokens']} "
                     f"{r['attention_backend']}{graphs}: host {r['host_s'] * 1e3:.2f} ms, {gpu}, "
                     f"wall {r['wall_s'] * 1e3:.2f} ms")
    lines += [f"flex decode kernel b={r['batch_size']} L={r['context_tokens']}: {r['time_s'] * 1e6:.1f} us, "
              f"{r['bytes_per_s'] / 1e12:.2f} TB/s ({r['share_of_copy_ceiling']:.0%} of the copy ceiling)"
              for r in record.get("flex_decode", [])]
    for r in record.get("prefill_engine", []):
        share = "" if r["share_of_whole_rate"] is None or r["chunk_size"] == r["prompt_tokens"] else \
            f", {r['share_of_whole_rate']:.0%} of the whole-prompt rate"
        lines.append(f"engine prefill {r['prompt_tokens']} in chunks of {r['chunk_size']} "
                     f"{r['attention_backend']} (scattered blocks), n={r['n']}: {r['time_s'] * 1e3:.1f} ms "
                     f"({r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}){share}")
    return lines
