"""``python -m longctx serve``: the OpenAI-compatible server over SmolLM2 on our engine."""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) over the engine"
    )
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--scheduler", default="chunked", help="monolithic | chunked (default chunked)")
    p.add_argument("--token-budget", type=int, default=256, help="chunked: tokens per step (default 256)")
    p.add_argument("--kv-blocks", type=int, default=256, help="KV cache blocks of 16 tokens (default 256)")
    p.add_argument(
        "--max-waiting", type=int, default=256, help="requests allowed to wait before 503 (default 256)"
    )
    p.add_argument("--seed", type=int, default=0, help="base seed of sampled requests without a seed")
    p.add_argument(
        "--model-name", default=None, help="the served model id (default HuggingFaceTB/SmolLM2-135M-Instruct)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=run)


def run(args) -> int:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.max_waiting < 0:
        raise ValueError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    from longctx.serve.launch import SCHEDULERS, run_server

    if args.scheduler not in SCHEDULERS:
        raise ValueError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {args.scheduler!r}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(f"longctx serve: http://{args.host}:{args.port}/v1 ({args.scheduler} scheduler)", flush=True)
    run_server(
        args.host,
        args.port,
        scheduler=args.scheduler,
        token_budget=args.token_budget,
        kv_blocks=args.kv_blocks,
        max_waiting=args.max_waiting,
        seed=args.seed,
        model_name=args.model_name,
    )
    return 0
