"""Decode starvation, measured: 8 decoding streams, then one long prompt arrives.

Monolithic prefill-first scheduling stops every stream for the whole prefill of the long prompt; chunked
prefill (Sarathi-Serve's stall-free order) caps each step at ``token_budget`` tokens, so the streams keep
decoding while the prompt is prefilled a chunk per step. For each scheduler this prints the streams' inter-
token latency (median, P99, max, and max over the decode-only median measured before the arrival) and the
long prompt's time to first token. It recommends the largest budget whose max ITL stays within
``--max-ratio`` (3x) of the decode-only median ITL.

    python benchmarks/decode_starvation.py                       # the full table (~1-2 min on 2 cores)
    python benchmarks/decode_starvation.py --prompt-tokens 1024 --budgets 64,256 --json out.json
    python benchmarks/decode_starvation.py --repeats 5 --json longctx/data/recorded/decode_starvation_cpu.json

``--repeats N`` runs every scheduler N times, in rounds (each round runs each scheduler once, so drift in the
machine's speed touches all of them alike) and pauses between rounds while other work loads the machine. The
table then shows each metric's median over the rounds with its range; the record keeps every round
(``rounds``), per scheduler its median run by the long prompt's TTFT with its step timeline (``rows``, with
the run's ``round``), and per scheduler the median, range and 95 % Student-t interval of the mean of each
metric (``summary``), with the commit and the load of each round in ``provenance``.

Recorded 2026-12-07 with --repeats 5 (longctx/data/recorded/decode_starvation_cpu.json), 2 threads on the
course's 2-core AMD EPYC VM, torch 2.13.0 CPU, fp32, commit 0c089aa; medians of 5 rounds:

    scheduler       median ITL   P99 ITL   max ITL  max/base  TTFT long    max/base range      TTFT range
    monolithic          0.120s    4.937s    4.937s     56.0x      4.80s      48.2 - 68.3     4.31 - 5.85
    chunked 32          0.187s    0.253s    0.255s      2.4x     16.32s       2.2 - 9.4     13.21 - 24.58
    chunked 64          0.274s    0.339s    0.339s      3.3x     10.02s       3.0 - 3.5      9.20 - 10.81
    chunked 128         0.422s    0.609s    0.609s      5.4x      7.93s       4.2 - 6.7      5.90 - 8.44
    chunked 256         0.615s    0.866s    0.866s      8.2x      6.24s       6.8 - 9.9      4.98 - 6.42
    largest budget with median max ITL <= 3x base: 32 tokens

Timings on a shared machine are noisy: one slow step sets max ITL. Other processes competing for the two
cores make two torch threads much slower than one; compare runs made under the same load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from decode_starvation_record import METRICS, recommended_budget, scheduler_name, summarize, write_record

from longctx.provenance import load_gate, wait_for_quiet

STREAM_TOPICS = [
    "the water cycle", "how bees make honey", "why the sky is blue", "the history of chess",
    "how a bicycle stays upright", "what causes the seasons", "how vaccines work", "the life of a star",
    "how rainbows form", "the rules of football", "how computers add numbers", "why leaves change colour",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt-tokens", type=int, default=2048, help="tokens of the long prompt")
    p.add_argument("--streams", type=int, default=8, help="decoding streams already running")
    p.add_argument("--budgets", default="32,64,128,256", help="comma-separated token budgets to try")
    p.add_argument("--no-monolithic", action="store_true", help="skip the monolithic baseline")
    p.add_argument(
        "--warmup-tokens", type=int, default=8, help="stream tokens before the long prompt arrives"
    )
    p.add_argument(
        "--after-tokens", type=int, default=4, help="long-prompt tokens to generate before stopping"
    )
    p.add_argument("--max-ratio", type=float, default=3.0, help="max ITL / decode-only median ITL allowed")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every scheduler (>= 2 gives intervals)")
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    p.add_argument("--force", action="store_true", help="write --json despite the load (a dry run)")
    args = p.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    if args.prompt_tokens < 1 or args.streams < 1 or any(b < 1 for b in args.budgets):
        p.error("--prompt-tokens, --streams and every budget must be >= 1")
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1 (rounds of every scheduler), got {args.repeats}")
    return args


def long_prompt_ids(tokenizer, n: int) -> list[int]:
    text = (
        "The committee met on a grey morning to review the annual report on river water quality. "
        "Sampling stations along the upper valley recorded nitrate levels, temperature, and flow, "
        "and each section of the report compares this year with the previous decade. "
    )
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer.encode(text)
    return ids[:n]


def run_one(model, tokenizer, scheduler, args) -> dict:
    from longctx.engine import Engine, percentile
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens

    stream_ids = [
        tokenizer.encode_chat(f"Explain {STREAM_TOPICS[i % len(STREAM_TOPICS)]} in detail.")
        for i in range(args.streams)
    ]
    long_ids = long_prompt_ids(tokenizer, args.prompt_tokens)
    max_stream_tokens = 512
    num_blocks = blocks_for_tokens(args.prompt_tokens + 64, 16) + sum(
        blocks_for_tokens(len(s) + max_stream_tokens, 16) for s in stream_ids
    )
    engine = Engine(TorchExecutor(model, BlockManager(num_blocks, 16)), scheduler)
    streams = [engine.add_request(ids, max_tokens=max_stream_tokens, eos_token_id=-1) for ids in stream_ids]
    while min(s.num_output_tokens for s in streams) < args.warmup_tokens + 1:
        engine.step()
    arrival_s = engine.clock.now()
    base = [g for s in streams for g in s.itl_s]  # decode-only gaps before the arrival
    first_token_index = {s.seq_id: s.num_output_tokens for s in streams}
    long = engine.add_request(long_ids, max_tokens=args.after_tokens + 1, eos_token_id=-1)
    while long.num_output_tokens < args.after_tokens + 1:
        engine.step()
        if any(s.num_output_tokens > max_stream_tokens - 2 for s in streams):
            raise RuntimeError("the streams ran out of tokens before the long prompt finished")
    gaps = []  # stream gaps from the last token before the arrival to the end
    for s in streams:
        t = s.token_times_s[first_token_index[s.seq_id] - 1 :]
        gaps += [b - a for a, b in zip(t, t[1:], strict=False)]
    gaps.sort()
    base_median = statistics.median(base)
    itl_max = max(gaps)
    prefill_steps = [r for r in engine.history if r.end_s > arrival_s and long.seq_id in r.seq_ids]
    largest = max(prefill_steps, key=lambda r: r.num_prefill_tokens)
    return {
        "scheduler": "monolithic" if scheduler.token_budget is None else "chunked",
        "token_budget": scheduler.token_budget,
        "itl_median_s": statistics.median(gaps),
        "itl_p99_s": percentile(gaps, 99),  # the course's (vLLM's) definition: linear interpolation
        "itl_max_s": itl_max,
        "itl_decode_only_median_s": base_median,
        "max_over_decode_only_median": itl_max / base_median,
        "ttft_long_s": long.ttft_s,
        "long_prefill_steps": len(prefill_steps) - args.after_tokens,
        "num_stream_gaps": len(gaps),
        # the step that carried the most prompt tokens (monolithic: the whole prefill, no decodes)
        "largest_prefill_s_per_token": largest.duration_s / largest.num_prefill_tokens,
        "largest_prefill_step_decode_tokens": largest.num_decode_tokens,
        "timeline": [
            {
                "start_s": round(r.start_s - arrival_s, 5), "duration_s": round(r.duration_s, 5),
                "prefill_tokens": r.num_prefill_tokens, "decode_tokens": r.num_decode_tokens,
            }
            for r in engine.history
        ],
    }


def print_table(args, summary: list[dict], torch_version: str, best) -> None:
    """Each metric's median over the rounds; with several rounds, the range of the worst gap and the TTFT."""
    n = summary[0]["n"]
    print(f"{args.streams} decoding streams + one {args.prompt_tokens}-token prompt, torch {torch_version}, "
          f"{args.threads} threads (ITL of the streams; TTFT of the long prompt); "
          + ("one run per scheduler" if n == 1 else f"median of {n} rounds [min - max]"))
    head = (f"{'scheduler':<14}{'median ITL':>12}{'P99 ITL':>10}{'max ITL':>10}{'max/base':>10}"
            f"{'TTFT long':>11}")
    if n > 1:
        head += f"{'max/base range':>18}{'TTFT range':>16}"
    print(head)
    print("-" * len(head))
    for s in summary:
        med = {metric: s[metric]["median"] for metric in METRICS}
        line = (f"{scheduler_name(s):<14}{med['itl_median_s']:>11.3f}s{med['itl_p99_s']:>9.3f}s"
                f"{med['itl_max_s']:>9.3f}s{med['max_over_decode_only_median']:>9.1f}x{med['ttft_long_s']:>10.2f}s")
        if n > 1:
            ratio, ttft = s["max_over_decode_only_median"], s["ttft_long_s"]
            line += (f"{ratio['min']:>10.1f} - {ratio['max']:<5.1f}"
                     f"{ttft['min']:>8.2f} - {ttft['max']:<5.2f}")
        print(line)
    base = statistics.median(s["itl_decode_only_median_s"]["median"] for s in summary)
    print(f"base = median ITL of decode-only steps before the prompt arrived (~{base:.3f}s)")
    if best is None:
        print(f"no budget keeps the median max ITL within {args.max_ratio:g}x base")
    else:
        print(f"largest budget with median max ITL <= {args.max_ratio:g}x base: {best} tokens")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.json is not None:
        load_gate(args.threads, args.force)
    import torch

    from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(), load_tokenizer()
    schedulers = [] if args.no_monolithic else [MonolithicScheduler()]
    schedulers += [ChunkedPrefillScheduler(token_budget=b) for b in args.budgets]
    if not schedulers:
        raise SystemExit("nothing to run: --no-monolithic and no --budgets")
    rounds, loads = [], []
    t0 = time.perf_counter()
    for i in range(args.repeats):
        loads.append(wait_for_quiet(args.threads, args.force or args.json is None))
        rounds.append([run_one(model, tokenizer, sch, args) for sch in schedulers])
        if args.repeats > 1:
            print(f"round {i + 1}/{args.repeats} done ({time.perf_counter() - t0:.0f} s, "
                  f"load {loads[-1]:.2f})", file=sys.stderr, flush=True)
    summary = summarize(rounds)
    best = recommended_budget(summary, args.max_ratio)
    print_table(args, summary, torch.__version__, best)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        write_record(args, rounds, summary, best, loads, torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
