"""``python -m longctx plan``: do U users of T tokens fit a paged KV pool of G GiB, block for block?

    python -m longctx plan --model llama-3-8b --kv-dtype fp8 --users 64 --context 8K --shared-prefix 2K \\
        --pool-gib 48

    python -m longctx plan --model llama-3-8b --kv-dtype fp8 --users 64 --context 8K --shared-prefix 2K \
        --pool-gib 48 --kv-scales per-tensor      # scales as vLLM / SGLang keep them: 24.125 GiB, 127 users

Prints bytes per token (scales included), blocks needed vs pool blocks, fits, max users, headroom and the
textbook number (``--json``: one JSON object, ``longctx.plan.Plan.to_dict()``). ``--kv-scales`` says where a
quantized cache keeps its scales: ``per-tensor`` (layer parameters, none in the pool: vLLM's FP8 KV cache,
SGLang), ``per-vector`` or ``per-group`` (in the pool, with each token: this course's engine); by default
what the engine stores for that dtype. Pure Python, starts instantly.
"""

from __future__ import annotations

import argparse
import json

from longctx.cli.calc import token_count
from longctx.kv.quant import FORMATS
from longctx.plan import KV_SCALES, plan
from longctx.specs import MODELS


def run_plan(args: argparse.Namespace) -> int:
    p = plan(args.model, args.kv_dtype, args.users, args.context, args.shared_prefix, args.block_size,
             pool_gib=args.pool_gib, kv_scales=args.kv_scales)
    print(json.dumps(p.to_dict()) if args.json else p)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plan", help="plan a paged KV pool: blocks needed, fits, max users")
    p.add_argument("--model", required=True, type=str.lower, choices=list(MODELS), metavar="MODEL",
                   help=f"registered model: {', '.join(MODELS)}")
    p.add_argument("--kv-dtype", required=True, type=str.lower, choices=list(FORMATS), metavar="DTYPE",
                   help=f"KV storage format: {', '.join(FORMATS)}")
    p.add_argument("--users", required=True, type=int, help="concurrent users (requests)")
    p.add_argument("--context", required=True, type=token_count,
                   help="KV tokens per user, prompt + output (8K ok)")
    p.add_argument("--shared-prefix", default=0, type=token_count,
                   help="prefix tokens common to all users (full blocks stored once; default 0)")
    p.add_argument("--block-size", default=16, type=int, help="paged block size in tokens (default 16)")
    p.add_argument("--pool-gib", required=True, type=float, help="KV pool size in GiB (2**30 bytes)")
    p.add_argument(
        "--kv-scales",
        default=None,
        type=str.lower,
        choices=list(KV_SCALES),
        metavar="LAYOUT",
        help="where a quantized KV cache keeps its scales: per-tensor (layer parameters, 0 bytes per "
        "token: vLLM, SGLang), per-vector or per-group (in the pool); default: what this "
        "course's engine stores for the dtype (fp8 per-vector, int8/int4 per-group)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_plan)
