"""``python -m longctx bench``: benchmark any OpenAI-compatible server with a streaming client."""

from __future__ import annotations

import json
import math
import sys


def _tokenizer_name(args) -> str | None:
    """``--tokenizer``, else ``--model`` when the registry knows it (a server of Gemma is benchmarked in
    Gemma's tokens), else the default (SmolLM2)."""
    from longctx.model.registry import MODELS

    if args.tokenizer is not None:
        return args.tokenizer
    return args.model if args.model.lower() in MODELS else None


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="streaming benchmark of an OpenAI-compatible server (TTFT/ITL/goodput)"
    )
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model id as the server names it (GET /v1/models)")
    p.add_argument(
        "--rate", type=float, default=None, help="Poisson arrivals, requests/s (default: all at once)"
    )
    p.add_argument("--concurrency", type=int, default=None, help="max requests in flight")
    p.add_argument("--num-prompts", type=int, required=True, help="requests to send")
    p.add_argument("--workload", default="chat",
                   help="needle | chat | long-prefill | shared-prefix (default chat)")
    p.add_argument("--tokenizer", default=None, metavar="NAME_OR_PATH",
                   help="the tokenizer that sizes the prompts (vLLM's --tokenizer): smollm2-135m, "
                   "gemma3-270m "
                   "or a .gguf path (default: --model when it names one of these, else smollm2-135m)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="prompt length in the tokenizer's tokens")
    p.add_argument("--prefix-tokens", type=int, default=None,
                   help="shared-prefix: tokens of the common system prompt (default 1024)")
    p.add_argument("--max-tokens", type=int, default=None, help="output tokens per request")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput SLO on time to first token")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput SLO on time per output token")
    p.add_argument(
        "--slo-itl-ms", type=float, default=None, help="goodput SLO on a request's worst token gap"
    )
    p.add_argument("--slo-e2e-ms", type=float, default=None, help="goodput SLO on end-to-end latency")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="also write the summary and per-request records as JSON (to PATH, or stdout)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from longctx.bench.client import run_benchmark
    from longctx.bench.client_metrics import format_table, summarize
    from longctx.bench.workloads import WORKLOADS, build_workload
    from longctx.request_metrics import SLO

    if args.workload not in WORKLOADS:
        raise ValueError(f"--workload must be one of {', '.join(WORKLOADS)}, got {args.workload!r}")
    if args.prefix_tokens is not None and args.workload != "shared-prefix":
        raise ValueError(f"--prefix-tokens applies to --workload shared-prefix only, not {args.workload!r}")
    if args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.rate is not None and not args.rate > 0:
        raise ValueError(f"--rate must be > 0, got {args.rate}")
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_itl_ms", "slo_e2e_ms"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    if not args.base_url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url must start with http:// or https://, got {args.base_url!r}")
    from longctx.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_name(args))
    requests = build_workload(
        args.workload, args.num_prompts, tokenizer, args.prompt_tokens, args.max_tokens, args.seed,
        prefix_tokens=args.prefix_tokens,
    )

    def ms(x):
        return None if x is None else x / 1000.0

    slos = SLO(ttft_s=ms(args.slo_ttft_ms), tpot_s=ms(args.slo_tpot_ms), itl_s=ms(args.slo_itl_ms),
               e2e_s=ms(args.slo_e2e_ms))
    rate = math.inf if args.rate is None else args.rate
    records, duration_s = run_benchmark(
        args.base_url, args.model, requests, rate=rate, concurrency=args.concurrency, seed=args.seed
    )
    summary = summarize(records, duration_s, slos)
    summary["config"] = {k: v for k, v in vars(args).items() if k != "func"}
    out = sys.stderr if args.json == "-" else sys.stdout
    out.write(format_table(summary) + "\n")
    if args.json:
        doc = json.dumps({"summary": summary, "requests": [r.to_dict() for r in records]}, indent=1)
        if args.json == "-":
            sys.stdout.write(doc + "\n")
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(doc + "\n")
    return 0 if summary["failed"] == 0 else 1
