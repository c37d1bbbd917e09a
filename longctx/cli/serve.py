"""``python -m longctx serve``: the OpenAI-compatible server over SmolLM2 on our engine.

The capstone's KV choices are flags: ``--kv-dtype`` (vLLM: ``--kv-cache-dtype``), ``--prefix-caching``
(vLLM: ``--enable-prefix-caching``) and ``--press NAME --compression-ratio R`` (KV pruning, ours only).
``GET /metrics`` reports the pool, the queues, the prefix cache and the latency histograms in Prometheus' text
format. The API follows vLLM's OpenAI-compatible server (``longctx.serve``): lm-evaluation-harness, guidellm
and the openai client use it unchanged.
"""

from __future__ import annotations


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server over the engine, as vLLM's (/v1/completions, "
        "/v1/chat/completions, /tokenize, /detokenize, /metrics, ...)"
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
    p.add_argument("--kv-dtype", "--kv-cache-dtype", dest="kv_dtype", default=None,
                   help="how the KV pool stores keys and values: fp32, bf16, fp16, fp8, int8, int4 "
                   "(default: the model's dtype, fp32 on a CPU)")
    p.add_argument("--prefix-caching", "--enable-prefix-caching", dest="prefix_caching", action="store_true",
                   help="share the cached full KV blocks of common prefixes (a system prompt) "
                   "between requests")
    p.add_argument("--press", default=None,
                   help="prune each prompt's KV cache: streaming_llm, snapkv, h2o, random, knorm")
    p.add_argument("--compression-ratio", type=float, default=None,
                   help="fraction of a prompt's KV entries the press evicts, in [0, 1) (needs --press)")
    from longctx.cli.model import add_placement_arguments

    add_placement_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.max_waiting < 0:
        raise ValueError(f"--max-waiting must be >= 0, got {args.max_waiting}")
    from longctx.cli.model import make_cli_press
    from longctx.kv.quant import get_format
    from longctx.model.device import resolve_placement
    from longctx.serve.launch import SCHEDULERS, run_server

    if args.scheduler not in SCHEDULERS:
        raise ValueError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {args.scheduler!r}")
    resolve_placement(args.device, args.dtype)  # a one-line error before the banner and the model
    kv_dtype = None if args.kv_dtype is None else get_format(args.kv_dtype).name
    press = make_cli_press(args.press, args.compression_ratio)  # clear errors before the model loads
    if press is not None and args.prefix_caching:
        raise ValueError("--press and --prefix-caching do not combine: "
                         "a press rewrites the blocks a cache shares")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    kv = f"KV {kv_dtype or 'in the model dtype'}" + (", prefix caching" if args.prefix_caching else "")
    if press is not None:
        kv += f", {args.press} press at {args.compression_ratio}"
    print(f"longctx serve: http://{args.host}:{args.port}/v1 ({args.scheduler} scheduler, {kv})", flush=True)
    run_server(
        args.host,
        args.port,
        scheduler=args.scheduler,
        token_budget=args.token_budget,
        kv_blocks=args.kv_blocks,
        max_waiting=args.max_waiting,
        seed=args.seed,
        model_name=args.model_name,
        kv_dtype=kv_dtype,
        prefix_caching=args.prefix_caching,
        press=args.press,
        compression_ratio=args.compression_ratio,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
    )
    return 0
