"""Monolithic vs chunked prefill as a *client* of `python -m longctx serve` sees them, at two loads, \
on a quiet
machine (load-gated, with provenance).

Scenario (``longctx.lessons.stall_server``): ``num_chat`` users stream long chat answers; one second later
``num_long`` requests with ``--long-prompt-tokens``-token prompts arrive. For each load and each scheduler a
fresh server is started (``ServerProcess``, 127.0.0.1, ``--threads`` torch threads) and the scenario runs
``--repeats`` times on it, one after the other (each repeat its own seed: its own story topics and long
documents). The streaming client times every chunk by vLLM's rule (``longctx.bench.client_metrics``) and the
script keeps, per row, the chat users' TTFT and ITL percentiles, each chat user's worst gap, each long
request's TTFT, and chat goodput: chat requests with TTFT <= ``--slo-ttft-s`` and no gap over ``--slo-itl-s``,
with its 95 % Wilson interval, and Fisher's exact test of chunked against monolithic at each load.

Load and provenance as in ``niah_grid.py`` (the house pattern, imported from there): the script REFUSES to
start (exit status 3) when the one-minute load average exceeds ``--threads``, the cores its server uses; it
pauses before each row while other work loads the machine (the load minus its own threads above
``--threads``); the record's ``meta`` carries the commit, date, machine, threads, the load at the start and
before every row, and ``n`` (rows; ``n_chat_requests`` per row). ``--force`` records anyway and marks the
record ``usable: false`` (dry runs only; the lesson refuses to show such a record as evidence).

Usage (on a quiet machine: check ``uptime``)::

    .venv/bin/python benchmarks/serving.py                    # writes longctx/data/recorded/serving_cpu.json
    .venv/bin/python benchmarks/serving.py --repeats 1 --out /tmp/s.json --force   # a dry run

The record shipped with the course and its table are printed by the lesson (08, section 5).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from niah_grid import RECORDED, load_gate, now, provenance, wait_for_quiet, write_record

LOADS = {"light": {"num_chat": 2, "num_long": 1}, "heavy": {"num_chat": 6, "num_long": 2}}
SCHEDULERS = ("monolithic", "chunked")
RECORD_VERSION = 2  # 2: load-gated, vLLM's chunk rule, repeats, Wilson intervals


def rows_started_quiet(loads_before_rows, threads: int) -> bool:
    """Whether every row started at a one-minute load average within the cores the server uses.
    ``wait_for_quiet`` lets a row start while *other* work stays under them (its own last server may still be
    in the average); the record is evidence only if the whole load was under them too."""
    return all(load <= threads for load in loads_before_rows)


def run_row(load: str, scheduler: str, args, tokenizer) -> dict:
    from longctx.bench.client_metrics import SLOs
    from longctx.evals.stats import wilson_interval
    from longctx.lessons.stall import StallScenario
    from longctx.lessons.stall_server import run_stall
    from longctx.serve.launch import ServerProcess

    shape = LOADS[load]
    slos = SLOs(ttft_s=args.slo_ttft_s, itl_s=args.slo_itl_s)
    ttft, itl, worst, long_ttft, good, errors = [], [], [], [], [], []
    with ServerProcess(scheduler=scheduler, token_budget=args.token_budget, kv_blocks=args.kv_blocks,
                       threads=args.threads) as server:
        for rep in range(args.repeats):
            scenario = StallScenario(shape["num_chat"], args.long_prompt_tokens)
            r = run_stall(server.base_url, "SmolLM2-135M-Instruct", tokenizer, slos, scenario,
                          chat_max_tokens=args.chat_max_tokens, seed=rep,
                          **{k: v for k, v in shape.items() if k != "num_chat"})
            ttft += r["chat_ttft_s"]
            itl += r["chat_itl_s"]
            worst += r["chat_worst_gap_s"]
            good += r["chat_good"]
            errors += r["errors"]
            long_ttft += [None if f is None else f - s
                          for s, f in zip(r["long_sent_s"], r["long_first_token_s"], strict=True)]
    import numpy as np

    def pct(values, p):
        return float(1000 * np.percentile(values, p)) if values else None

    k, n = sum(good), len(good)
    lo, hi = wilson_interval(k, n) if n else (0.0, 1.0)
    # The chat users of one repeat share its long prompt(s), so their outcomes are not independent: the
    # independent unit is the repeat. A repeat meets the SLOs when every one of its chat users does.
    per = shape["num_chat"]
    repeats_met = sum(all(good[i : i + per]) for i in range(0, len(good), per))
    return {
        "load": load, **shape, "scheduler": scheduler,
        "token_budget": args.token_budget if scheduler == "chunked" else None,
        "repeats": args.repeats, "n_chat_requests": n,
        "chat_ttft_ms": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "chat_itl_ms": {"p50": pct(itl, 50), "p99": pct(itl, 99), "n": len(itl)},
        "chat_worst_gap_ms": [1000 * w for w in worst],
        "long_ttft_ms": [None if x is None else 1000 * x for x in long_ttft],
        "chat_good": k, "chat_completed": n, "chat_good_wilson95": [lo, hi], "repeats_met": repeats_met,
        "errors": errors,
    }  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="the server's torch threads (= the cores it uses)")
    ap.add_argument("--token-budget", type=int, default=64)
    ap.add_argument("--kv-blocks", type=int, default=512)
    ap.add_argument("--long-prompt-tokens", type=int, default=1024)
    ap.add_argument("--chat-max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3, help="scenario runs per row, on the same server")
    ap.add_argument("--slo-ttft-s", type=float, default=2.0, help="chat goodput: TTFT bound (s)")
    ap.add_argument("--slo-itl-s", type=float, default=1.0, help="chat goodput: worst-gap bound (s)")
    ap.add_argument("--force", action="store_true",
                    help="record despite the load (marks the record unusable)")
    ap.add_argument("--out", type=Path, default=RECORDED / "serving_cpu.json")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    gate_load = load_gate(args.threads, args.force)

    from longctx.evals.stats import fisher_exact
    from longctx.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    meta = provenance(args.threads, usable=not args.force, gate_load=gate_load)
    meta.update(
        benchmark="serving_cpu", record_version=RECORD_VERSION,
        model="SmolLM2-135M-Instruct on `python -m longctx serve` (fp32 KV, CPU), client longctx.bench",
        method=(f"longctx.lessons.stall_server, {args.repeats} repeats per row on one server: chat users "
                f"stream {args.chat_max_tokens}-token answers; 1 s later {args.long_prompt_tokens}-token "
                f"prompts arrive; client-side timestamps, every chunk with choices timed (vLLM's rule); "
                f"chat goodput = chat requests with TTFT <= {args.slo_ttft_s} s and worst gap <= "
                f"{args.slo_itl_s} s"),
        slo_ttft_s=args.slo_ttft_s, slo_itl_s=args.slo_itl_s, token_budget=args.token_budget,
        kv_blocks=args.kv_blocks, load_average_1min_before_rows=[],
    )  # fmt: skip
    rows = []
    for load in LOADS:
        for scheduler in SCHEDULERS:
            before = wait_for_quiet(args.threads, args.force)
            meta["load_average_1min_before_rows"].append(round(before, 2))
            row = run_row(load, scheduler, args, tokenizer)
            row["load_average_1min_start"] = round(before, 2)
            rows.append(row)
            print(f"{now()} {load:<6} {scheduler:<11} done (load {before:.2f})", file=sys.stderr, flush=True)
    for load in LOADS:
        mono, chunk = (next(r for r in rows if r["load"] == load and r["scheduler"] == s) for s in SCHEDULERS)
        meta.setdefault("fisher_over_repeats", {})[load] = fisher_exact(
            chunk["repeats_met"], chunk["repeats"], mono["repeats_met"], mono["repeats"])
    if meta["usable"] and not rows_started_quiet(meta["load_average_1min_before_rows"], args.threads):
        meta["usable"] = False  # a row started on a machine busier than the cores it uses: not evidence
        print(f"a row started above {args.threads} of load average: the record is marked unusable",
              file=sys.stderr)
    import os

    meta["load_average_1min_end"] = round(os.getloadavg()[0], 2)
    meta["n_chat_requests"] = sum(r["n_chat_requests"] for r in rows)
    write_record(args.out, {"meta": meta, "rows": rows})
    print(format_rows(rows))
    return 0


def format_rows(rows) -> str:
    """The record as a table (the lesson prints the same)."""
    lines = [f"{'load':<6} {'scheduler':<11} {'chat TTFT p50/p99 ms':>21} {'chat ITL p50/p99 ms':>20} "
             f"{'worst gap max ms':>17} {'long TTFT med ms':>17} {'chat good':>10}"]
    for r in rows:
        long_ = sorted(x for x in r["long_ttft_ms"] if x is not None)
        med = long_[len(long_) // 2] if long_ else float("nan")
        lines.append(
            f"{r['load']:<6} {r['scheduler']:<11} "
            f"{r['chat_ttft_ms']['p50']:>10.0f}/{r['chat_ttft_ms']['p99']:<10.0f}"
            f"{r['chat_itl_ms']['p50']:>10.0f}/{r['chat_itl_ms']['p99']:<9.0f} "
            f"{max(r['chat_worst_gap_ms']):>17.0f} "
            f"{med:>17.0f} {r['chat_good']:>4}/{r['chat_completed']:<5}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
