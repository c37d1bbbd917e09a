"""``python -m longctx serve [MODEL]``: the OpenAI-compatible server over our engine, with vLLM's flags.

vLLM's names are the flags (``vllm serve``'s), today's names stay as aliases: ``--max-num-batched-tokens``
(``--token-budget``), ``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill`` (``--scheduler chunked |
monolithic``), ``--served-model-name`` (``--model-name``), ``--num-gpu-blocks-override`` (``--kv-blocks``),
``--kv-cache-dtype`` (``--kv-dtype``), ``--enable-prefix-caching`` (``--prefix-caching``); the capstone's KV
pruning is ours only (``--press NAME --compression-ratio R``). The README's serving section maps every vLLM
flag to ours or says it is not supported. ``GET /metrics`` reports vLLM's metric names; the API follows
vLLM's OpenAI-compatible server (``longctx.serve``): lm-evaluation-harness, guidellm and the openai client use
it unchanged.
"""

from __future__ import annotations

import argparse
import os

# vLLM's --kv-cache-dtype spellings -> ours (None: the model's dtype); others are ours or refused
KV_CACHE_DTYPES = {"auto": None, "fp8_e4m3": "fp8", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
KV_CACHE_REFUSED = {
    "fp8_e5m2": "this server's fp8 pool is E4M3 (fp8, fp8_e4m3) with a scale per token and head; no E5M2",
    "fp8_inc": "Intel Gaudi's fp8 is not supported", "fp8_ds_mla": "DeepSeek's MLA fp8 is not supported",
}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server over the engine, as vLLM's (/v1/completions, "
        "/v1/chat/completions, /tokenize, /detokenize, /metrics, ...)"
    )
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model, as `vllm serve MODEL` takes it (same as --model)")
    p.add_argument("--model", default=None, help="the model to serve: smollm2-135m or "
                   "HuggingFaceTB/SmolLM2-135M-Instruct (default)")
    p.add_argument("--served-model-name", "--model-name", dest="model_name", nargs="+", default=None,
                   help="the name(s) clients send as 'model' (default: the model as given); the first "
                   "answers in responses")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--api-key", default=None, help="every /v1 route needs 'Authorization: Bearer KEY' "
                   "(default: the VLLM_API_KEY environment variable, else none)")
    p.add_argument("--scheduler", default=None, help="monolithic | chunked (default chunked)")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="chunked prefill (default on, as vLLM V1): --no-enable-chunked-prefill is "
                   "--scheduler monolithic")
    p.add_argument("--max-num-batched-tokens", "--token-budget", dest="token_budget", type=int, default=None,
                   help="tokens per engine step (chunked: default 256; monolithic: default no limit)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="sequences holding KV blocks at once (default 256, as vLLM)")
    p.add_argument("--num-gpu-blocks-override", "--kv-blocks", dest="kv_blocks", type=int, default=None,
                   help="KV cache blocks in the pool (default 256, or what --gpu-memory-utilization leaves)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="CUDA only: size the KV pool to this fraction of the device's memory, beside the "
                   "model (on a CPU give --num-gpu-blocks-override)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + output tokens of one request (default: the model's context); larger than "
                   "the pool holds: refused at start, as vLLM")
    p.add_argument("--max-waiting", type=int, default=None,
                   help="requests allowed to wait for KV blocks before a 503 (default: no limit, as vLLM)")
    p.add_argument("--seed", type=int, default=0, help="base seed of sampled requests without a seed")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--kv-cache-dtype", "--kv-dtype", dest="kv_dtype", default=None,
                   help="how the KV pool stores keys and values: auto (the model's dtype, default), fp32, "
                   "bf16, fp16, fp8 (= fp8_e4m3), int8, int4")
    p.add_argument("--enable-prefix-caching", "--prefix-caching", dest="prefix_caching",
                   action=argparse.BooleanOptionalAction, default=False,
                   help="share the cached full KV blocks of common prefixes (a system prompt) between "
                   "requests (default off, unlike vLLM V1: the lessons measure with and without)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (a file's path, or the text) instead of the model's")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a request's own chat_template (refused by default, as vLLM: a template is "
                   "code)")
    p.add_argument("--uvicorn-log-level", default="warning", choices=LOG_LEVELS,
                   help="uvicorn's log level (default warning; info and below log each request's line "
                   "at debug)")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="accepted for vLLM's command lines: this server never logs request contents")
    p.add_argument("--press", default=None,
                   help="prune each prompt's KV cache: streaming_llm, snapkv, h2o, random, knorm")
    p.add_argument("--compression-ratio", type=float, default=None,
                   help="fraction of a prompt's KV entries the press evicts, in [0, 1) (needs --press)")
    from longctx.cli.model import add_placement_arguments

    add_placement_arguments(p)
    p.set_defaults(func=run)


def kv_cache_dtype(name: str | None) -> str | None:
    """Our pool format for a ``--kv-cache-dtype`` spelling (vLLM's or ours), checked; None: the model's."""
    if name is None or name in KV_CACHE_DTYPES:
        return None if name is None else KV_CACHE_DTYPES[name]
    if name in KV_CACHE_REFUSED:
        raise ValueError(f"--kv-cache-dtype {name}: {KV_CACHE_REFUSED[name]}")
    from longctx.kv.quant import get_format

    return get_format(name).name


def model_ref(args) -> str:
    """The model: the positional one or ``--model`` (the same if both are given)."""
    from longctx.serve.launch import DEFAULT_MODEL_REF

    if args.model_tag and args.model and args.model_tag != args.model:
        raise ValueError(f"two models given: {args.model_tag!r} and --model {args.model!r}")
    return args.model_tag or args.model or DEFAULT_MODEL_REF


def scheduler_name(args) -> str:
    """``--scheduler`` and ``--enable-chunked-prefill`` agreed."""
    from longctx.serve.launch import SCHEDULERS

    if args.scheduler is not None and args.scheduler not in SCHEDULERS:
        raise ValueError(f"--scheduler must be one of {', '.join(SCHEDULERS)}, got {args.scheduler!r}")
    chunked = args.enable_chunked_prefill
    implied = None if chunked is None else "chunked" if chunked else "monolithic"
    if args.scheduler is not None and implied is not None and args.scheduler != implied:
        raise ValueError(f"--scheduler {args.scheduler} contradicts "
                         f"--{'' if chunked else 'no-'}enable-chunked-prefill")
    return args.scheduler or implied or "chunked"


def _check_numbers(args) -> None:
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    for flag, value in (("--max-waiting", args.max_waiting), ("--max-num-seqs", args.max_num_seqs),
                        ("--max-num-batched-tokens", args.token_budget),
                        ("--max-model-len", args.max_model_len),
                        ("--num-gpu-blocks-override", args.kv_blocks), ("--block-size", args.block_size)):
        if value is not None and value < (0 if flag == "--max-waiting" else 1):
            raise ValueError(f"{flag} must be >= {0 if flag == '--max-waiting' else 1}, got {value}")


def run(args) -> int:
    _check_numbers(args)
    from longctx.cli.model import make_cli_press
    from longctx.model.device import resolve_placement
    from longctx.serve.launch import build_app, serve_app

    ref, scheduler = model_ref(args), scheduler_name(args)
    resolve_placement(args.device, args.dtype)  # a one-line error before the banner and the model
    kv_dtype = kv_cache_dtype(args.kv_dtype)
    if args.gpu_memory_utilization is not None and not args.device.startswith("cuda"):
        raise ValueError("--gpu-memory-utilization sizes the KV pool from CUDA memory; on a CPU give the "
                         "pool in blocks: --num-gpu-blocks-override (--kv-blocks)")
    press = make_cli_press(args.press, args.compression_ratio)  # clear errors before the model loads
    if press is not None and args.prefix_caching:
        raise ValueError("--press and --prefix-caching do not combine: "
                         "a press rewrites the blocks a cache shares")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    app = build_app(
        model_ref=ref,
        scheduler=scheduler,
        token_budget=args.token_budget,
        kv_blocks=args.kv_blocks,
        max_waiting=args.max_waiting,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=args.seed,
        model_name=args.model_name,
        kv_dtype=kv_dtype,
        prefix_caching=args.prefix_caching,
        press=args.press,
        compression_ratio=args.compression_ratio,
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY") or None,
        chat_template=args.chat_template,
        trust_request_chat_template=args.trust_request_chat_template,
    )
    kv = f"KV {kv_dtype or 'in the model dtype'}" + (", prefix caching" if args.prefix_caching else "")
    if press is not None:
        kv += f", {args.press} press at {args.compression_ratio}"
    print(f"longctx serve {ref}: http://{args.host}:{args.port}/v1 ({scheduler} scheduler, {kv})", flush=True)
    serve_app(app, args.host, args.port, args.uvicorn_log_level)
    return 0
