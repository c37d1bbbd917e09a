"""``python -m longctx simulate``: serve a seeded workload at GPU scale in the simulator.

    python -m longctx simulate --model llama-3-8b --gpu h100 --scheduler chunked --token-budget 512 \\
        --num-requests 1000 --rate 8 --prompt-tokens 2048 --output-tokens 256 --seed 0 --json

KV pool: ``--kv-dtype`` (bf16 default; fp8, int8, int4 count their scales: ``longctx.kv.quant``), sized
from the GPU or ``--pool-gib`` GiB (``longctx plan``'s pool). ``--prefix-caching`` shares cached full
blocks; ``--shared-prefix TOKENS`` starts every prompt with the same tokens, e.g.

    python -m longctx simulate --model llama-3-8b --gpu h100 --scheduler chunked --num-requests 64 \
        --rate inf --prompt-tokens 7936 --output-tokens 256 --kv-dtype fp8 --pool-gib 48 \
        --prefix-caching --shared-prefix 2K

Prints TTFT, TPOT, ITL and E2E percentiles (seconds) and throughput. ``--json`` prints one object with
keys ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s`` (each ``p50``/``p90``/``p95``/``p99``/``mean``) and
``throughput_tok_s`` (output tokens per second). Same seed, same output. No torch.
"""

from __future__ import annotations

import argparse
import json
import sys

from longctx.cli.calc import token_count
from longctx.kv.quant import FORMATS

SCHEDULERS = ("monolithic", "chunked")


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"--{flag} must be >= 1, got {value}")


def run_simulate(args: argparse.Namespace) -> int:
    from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler
    from longctx.sim import make_workload, simulate
    from longctx.specs import get_hardware, get_model

    model, gpu = get_model(args.model), get_hardware(args.gpu)
    for flag in ("num_requests", "prompt_tokens", "output_tokens"):
        _positive(flag.replace("_", "-"), getattr(args, flag))
    if args.token_budget is not None:
        _positive("token-budget", args.token_budget)
    if not args.rate > 0:
        raise ValueError(f"--rate must be > 0 requests per second (inf: all at once), got {args.rate}")
    if args.scheduler == "chunked":
        scheduler = ChunkedPrefillScheduler(token_budget=args.token_budget or 512)
    else:
        scheduler = MonolithicScheduler(max_num_batched_tokens=args.token_budget)
    workload = make_workload(args.num_requests, args.rate, args.prompt_tokens, args.output_tokens,
                             seed=args.seed, arrival=args.arrival, burstiness=args.burstiness)
    progress = not args.no_progress and args.num_requests >= 1000 and sys.stderr.isatty()
    result = simulate(workload, scheduler, model, gpu, progress=progress, kv_dtype=args.kv_dtype,
                      pool_gib=args.pool_gib, prefix_caching=args.prefix_caching,
                      shared_prefix_tokens=args.shared_prefix)
    out = result.to_dict()
    out["config"].update(rate_qps=args.rate, prompt_tokens=args.prompt_tokens,
                         output_tokens=args.output_tokens, seed=args.seed, arrival=args.arrival)
    if args.plot:
        _plot(result, args.plot)
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"{model.name} on {gpu.name}, {out['config']['scheduler']}, {args.num_requests} requests at "
          f"{args.rate:g} req/s, {args.prompt_tokens} prompt + {args.output_tokens} output tokens")
    print(f"{'metric':<10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}   (ms)")
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = out[key]
        cells = "".join(
            f"{'-' if d[p] is None else f'{1e3 * d[p]:.1f}':>10}" for p in ("p50", "p90", "p95", "p99")
        )
        print(f"{key[:-2].upper():<10}{cells}")
    print(
        f"throughput {out['throughput_tok_s']:,.0f} output tok/s, "
        f"{out['request_throughput_req_s']:.2f} req/s, "
        f"{out['num_preemptions']} preemptions, {out['num_steps']:,} steps"
    )
    c = out["config"]
    line = (f"KV pool  {c['num_blocks']:,} blocks of {c['block_size']} tokens, {c['kv_dtype']} "
            f"({c['pool_bytes_per_token']:,} B/token), peak {out['peak_used_blocks']:,} used")
    if c["prefix_caching"]:
        line += f"; prefix cache {out['prefix_hit_tokens']:,} hit tokens, {out['num_evictions']:,} evictions"
    print(line)
    return 0


def _plot(result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    start = np.array([s.start_s for s in result.steps])
    dur = np.array([s.duration_s for s in result.steps])
    ax1.plot(start, 1e3 * dur, lw=0.6)
    ax1.set(xlabel="simulated time (s)", ylabel="step time (ms)", title="iterations")
    itl = np.sort([g for r in result.requests for g in r.itl_s])
    if itl.size:
        ax2.plot(1e3 * itl, np.linspace(0, 1, itl.size))
    ax2.set(xscale="log", xlabel="inter-token latency (ms)", ylabel="fraction", title="ITL CDF")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rate(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid rate {text!r}: requests per second, or inf") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="simulate serving a workload on a GPU (cost model, no torch)")
    p.add_argument("--model", required=True, help="registered model name, e.g. llama-3-8b")
    p.add_argument("--gpu", required=True, help="registered GPU name, e.g. h100")
    p.add_argument("--scheduler", required=True, choices=SCHEDULERS, help="monolithic or chunked prefill")
    p.add_argument("--token-budget", type=int, default=None,
                   help="tokens per step (chunked: default 512; monolithic: max batched tokens)")
    p.add_argument("--num-requests", type=int, required=True, help="requests in the workload")
    p.add_argument(
        "--rate", type=_rate, required=True, help="mean arrival rate, requests/s (inf: all at t=0)"
    )
    p.add_argument("--prompt-tokens", type=token_count, required=True, help="prompt length (2K ok)")
    p.add_argument("--output-tokens", type=token_count, required=True, help="output length")
    p.add_argument("--arrival", choices=("poisson", "gamma"), default="poisson", help="arrival process")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    p.add_argument("--kv-dtype", type=str.lower, choices=list(FORMATS), default="bf16", metavar="DTYPE",
                   help=f"KV storage format: {', '.join(FORMATS)} (default bf16)")
    p.add_argument("--pool-gib", type=float, default=None,
                   help="KV pool of this many GiB (default: GPU memory left after the weights)")
    p.add_argument(
        "--prefix-caching", action="store_true", help="share cached full KV blocks between requests"
    )
    p.add_argument("--shared-prefix", type=token_count, default=0, metavar="TOKENS",
                   help="tokens every prompt starts with (2K ok; default 0)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE", default=None, help="save a step timeline and ITL CDF (png/pdf)")
    p.add_argument("--no-progress", action="store_true", help="never draw the progress bar")
    p.set_defaults(func=run_simulate)
