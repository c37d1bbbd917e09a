"""``python -m longctx kv`` and ``python -m longctx flops``: napkin math from the terminal.

    python -m longctx kv --model llama-3-8b --tokens 8K --dtype fp8 --requests 64 --shared-prefix 2K
    python -m longctx flops --model teaching-7b-mha --tokens 128K --attention full --json

Token counts accept a K (x1024) or M (x1024**2) suffix, as the source writes 8K = 8,192. Imports only
the calculators (numpy at most): it starts instantly and works without torch.
"""

from __future__ import annotations

import argparse
import json

from longctx import flops as fl
from longctx import memory as mem
from longctx.specs import get_model

_SUFFIX = {"k": 2**10, "m": 2**20}


def token_count(text: str) -> int:
    """Parse ``8192``, ``8K`` (8192), ``1M`` (1,048,576) or ``1_000``; the sign is kept for validation."""
    raw = text.strip().replace("_", "").replace(",", "")
    scale = 1
    if raw and raw[-1].lower() in _SUFFIX:
        scale, raw = _SUFFIX[raw[-1].lower()], raw[:-1]
    try:
        return int(raw) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid token count {text!r}: use an integer, optionally with K or M (8K = 8192)"
        ) from None


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _check_counts(**counts: int | None) -> None:
    for flag, value in counts.items():
        if value is not None and value < 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 0, got {value}")


def run_kv(args: argparse.Namespace) -> int:
    _check_counts(tokens=args.tokens, requests=args.requests, shared_prefix=args.shared_prefix)
    model = get_model(args.model)
    bpt = mem.kv_bytes_per_token(model, args.dtype)
    pool = mem.kv_pool(model, args.requests, args.tokens, args.dtype, args.shared_prefix, args.block_size)
    result = {
        "model": model.name, "dtype": args.dtype.lower(), "tokens": args.tokens, "requests": args.requests,
        "shared_prefix_tokens": args.shared_prefix, "block_size": args.block_size, "bytes_per_token": bpt,
        "bytes": pool.total_bytes, "gib": pool.total_bytes / mem.GiB,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [
        ("model", model.name), ("dtype", result["dtype"]), ("tokens per request", f"{args.tokens:,}"),
        ("requests", f"{args.requests:,}"),
    ]
    if args.shared_prefix:
        rows.append(("shared prefix", f"{args.shared_prefix:,} tokens (stored once)"))
    if args.block_size:
        rows.append(("block size", f"{args.block_size} tokens (rounded up)"))
    if model.is_hybrid:
        rows.append(("sliding layers", f"{model.num_sliding_layers} of {model.num_layers} hold their last "
                                       f"{model.sliding_window:,} tokens only (KV per token: all layers)"))
    rows += [
        ("KV per token", f"{bpt / mem.KiB:,.1f} KiB  ({bpt:,} B)"),
        ("KV total", f"{pool.total_bytes / mem.GiB:,.3f} GiB  ({pool.total_bytes:,} B)"),
    ]
    print(_table(rows))
    return 0


def run_flops(args: argparse.Namespace) -> int:
    _check_counts(tokens=args.tokens, cached=args.cached)
    model = get_model(args.model)
    count = fl.chunk_flops(model, args.tokens, args.cached, args.attention, args.params)
    result = {
        "model": model.name, "tokens": args.tokens, "cached_tokens": args.cached, "attention": args.attention,
        "params": args.params, "num_params": fl.linear_params(model, args.params),
        "linear_flops": count.linear_flops, "attention_flops": count.attention_flops,
        "total_flops": count.total_flops, "attention_share": count.attention_share,
        "crossover_tokens": fl.crossover_tokens(model, args.attention, args.params),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    tf = 1e12
    rows = [
        ("model", f"{model.name}  (N = {result['num_params']:,} params, {args.params})"),
        ("new tokens", f"{args.tokens:,}" + (f" after {args.cached:,} cached" if args.cached else "")),
        ("attention", args.attention), ("linear (2*T*N)", f"{count.linear_flops / tf:,.3f} TFLOPs"),
        ("attention (QK^T, AV)", f"{count.attention_flops / tf:,.3f} TFLOPs"),
        ("total", f"{count.total_flops / tf:,.3f} TFLOPs"),
        ("attention share", f"{100 * count.attention_share:.1f} %"),
        ("crossover (prefill)", f"{result['crossover_tokens']:,.0f} tokens"),
    ]
    print(_table(rows))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    kv = subparsers.add_parser("kv", help="KV-cache bytes for a model, context length and dtype")
    kv.add_argument("--model", required=True, help="registered model name, e.g. llama-3-8b")
    kv.add_argument("--tokens", required=True, type=token_count, help="context tokens per request (8K ok)")
    kv.add_argument("--dtype", default="fp16", help="KV dtype: fp32, fp16, bf16, fp8, int8, int4")
    kv.add_argument("--requests", default=1, type=int, help="concurrent requests (default 1)")
    kv.add_argument("--shared-prefix", default=0, type=token_count, help="prefix tokens stored once")
    kv.add_argument("--block-size", default=None, type=int, help="paged block size in tokens (rounds up)")
    kv.add_argument("--json", action="store_true", help="print one JSON object")
    kv.set_defaults(func=run_kv)

    fp = subparsers.add_parser("flops", help="linear and attention FLOPs of a prefill or chunk")
    fp.add_argument("--model", required=True, help="registered model name, e.g. teaching-7b-mha")
    fp.add_argument("--tokens", required=True, type=token_count, help="new tokens (prefill or chunk)")
    fp.add_argument("--cached", default=0, type=token_count, help="tokens already cached (default 0)")
    fp.add_argument("--attention", default="causal", choices=fl.ATTENTION_KINDS,
                    help="causal (default) or full attention")
    fp.add_argument("--params", default="all", choices=fl.PARAM_CONVENTIONS,
                    help="N convention: all parameters (default, the source's) or matmul ones")
    fp.add_argument("--json", action="store_true", help="print one JSON object")
    fp.set_defaults(func=run_flops)
