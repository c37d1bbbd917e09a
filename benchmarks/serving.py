"""Monolithic vs chunked prefill as a *client* of `python -m longctx serve` sees them, at two loads.

Scenario (``longctx.bench.stall``): ``num_chat`` users stream long chat answers; one second later
``num_long`` requests with 768-token prompts arrive. For each load and each scheduler, a fresh server is
started (``ServerProcess``, 127.0.0.1) and the streaming client measures the chat users' TTFT and every
inter-token gap, and the long requests' TTFT. Goodput counts chat requests meeting TTFT <= 5 s and a worst gap
<= 1 s. Writes ``longctx/data/recorded/serving_cpu.json`` (with provenance) and prints a table.

Usage::

    python benchmarks/serving.py [--threads 2] [--token-budget 64] [--out PATH]

Recorded on the course machine, 2026-12-01T10:11Z, 2 cores SHARED with other jobs (1-min load average 8.3
before, 15.0 after: every time below is several times what a quiet machine gives), torch 2.13.0+cpu, 2 threads,
chunked token budget 64::

    load   scheduler    chat TTFT p50/p99 ms  chat ITL p50/p99 ms  worst gap ms  long TTFT ms  goodput req/s
    light  monolithic         653/682              201/12700             12700         12505    0.000 (0/2)
    light  chunked            903/1095             455/1152               1152          9550    0.000 (0/2)
    heavy  monolithic        3156/3202             341/24243             26809         25232    0.000 (0/6)
    heavy  chunked           1557/2481             679/2338               2338         17511    0.000 (0/6)

What it shows: on the monolithic server each chat user's worst gap is the whole prefill of the long prompts
(12.7 s, 26.8 s); chunked prefill cuts it 11x at both loads, at the price of a higher median ITL (every step
carries a 64-token chunk). On this overloaded machine no chat request met the 1 s worst-gap SLO, so goodput
is 0 for both; rerun on a quiet machine to see it separate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOADS = {"light": {"num_chat": 2, "num_long": 1}, "heavy": {"num_chat": 6, "num_long": 2}}
SLO_TTFT_S, SLO_ITL_S = 5.0, 1.0  # CPU-sized targets: a first word within 5 s, no pause over 1 s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--token-budget", type=int, default=64)
    ap.add_argument("--long-prompt-tokens", type=int, default=768)
    ap.add_argument("--chat-max-tokens", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ROOT / "longctx/data/recorded/serving_cpu.json")
    args = ap.parse_args(argv)

    import torch

    from longctx.bench.metrics import SLOs
    from longctx.bench.stall import run_stall
    from longctx.model.tokenizer import load_tokenizer
    from longctx.serve.launch import ServerProcess

    tokenizer = load_tokenizer()
    load_before = os.getloadavg()[0]
    rows = []
    for load, shape in LOADS.items():
        for scheduler in ("monolithic", "chunked"):
            with ServerProcess(
                scheduler=scheduler, token_budget=args.token_budget, kv_blocks=256, threads=args.threads
            ) as server:
                r = run_stall(
                    server.base_url,
                    "SmolLM2-135M-Instruct",
                    tokenizer,
                    SLOs(SLO_TTFT_S, None, SLO_ITL_S),
                    chat_max_tokens=args.chat_max_tokens,
                    long_prompt_tokens=args.long_prompt_tokens,
                    **shape,
                )
            chat, long_ = r["chat"], r["long"]
            rows.append(
                {
                    "load": load,
                    **shape,
                    "scheduler": scheduler,
                    "token_budget": args.token_budget if scheduler == "chunked" else None,
                    "chat_ttft_ms": {k: chat["ttft_ms"][k] for k in ("p50", "p99")},
                    "chat_itl_ms": {k: chat["itl_ms"][k] for k in ("p50", "p99")},
                    "chat_worst_gap_ms": 1000 * max(r["chat_worst_gap_s"], default=0.0),
                    "long_ttft_ms": long_["ttft_ms"]["p50"],
                    "chat_goodput_rps": chat["goodput"],
                    "chat_good": chat["num_good"],
                    "chat_completed": chat["completed"],
                    "errors": r["errors"],
                }
            )
            print(f"{load:<6} {scheduler:<11} done", file=sys.stderr)
    result = {
        "benchmark": "serving_cpu",
        "model": "SmolLM2-135M-Instruct on longctx serve (fp32, CPU)",
        "method": (
            f"longctx.bench.stall: chat users stream {args.chat_max_tokens}-token answers; 1 s later "
            f"{args.long_prompt_tokens}-token prompts arrive; client-side timestamps; goodput = chat "
            f"requests with TTFT <= {SLO_TTFT_S} s and worst gap <= {SLO_ITL_S} s per second"
        ),
        "provenance": {
            "cpu_count": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(format_rows(rows))
    return 0


def format_rows(rows) -> str:
    head = (
        f"{'load':<6} {'scheduler':<11} {'chat TTFT p50/p99 ms':>21} {'chat ITL p50/p99 ms':>20} "
        f"{'worst gap ms':>13} {'long TTFT ms':>13} {'goodput req/s':>14}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['load']:<6} {r['scheduler']:<11} {r['chat_ttft_ms']['p50']:>10.0f}/{r['chat_ttft_ms']['p99']:<10.0f}"
            f"{r['chat_itl_ms']['p50']:>10.0f}/{r['chat_itl_ms']['p99']:<9.0f} {r['chat_worst_gap_ms']:>13.0f} "
            f"{r['long_ttft_ms']:>13.0f} {r['chat_goodput_rps']:>8.3f} ({r['chat_good']}/{r['chat_completed']})"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
