"""Throughput: our engine versus transformers on a serving workload, all at once, and per decode step.

    .venv/bin/python benchmarks/throughput.py [--requests 48] [--rate 2] [--record]

Same model (SmolLM2-135M-Instruct, fp32, CPU), same prompts, same answer lengths (EOS ignored, so both do
the same work), one run:

1. **Serving workload**: ``--requests`` chat requests arrive as a seeded Poisson process (``--rate`` per
   second), prompts of 30-330 tokens (a question, some with a pasted document), answers of 16-128 tokens.
   Ours: the engine with continuous batching and chunked prefill (``ChunkedPrefillScheduler``), wall
   clock. Transformers: the best a user can do without a serving engine: whenever the model is idle, take
   every request that has arrived (up to ``--hf-batch``) as one left-padded static batch and ``generate``
   it to completion (the batch runs until its longest answer is done; a request arriving meanwhile waits).
   Token times are taken per step (a logits processor), so TTFT and E2E are per request.
2. **All at once** (the old benchmark's case, second row): the same requests all sent at t = 0. A static
   batch loses little here; this row is the one where continuous batching has least to win.
3. **Per-step cost** at equal batch and context (B = 1, 8, 16; context 512 and 2,048): one decode step of
   our ``TorchExecutor`` (paged cache, batch built by the engine's own ``ScheduledBatch``) vs one forward
   of transformers' ``LlamaForCausalLM`` with its ``DynamicCache`` at the same length (median of repeats).

Targets (issue 10): serving throughput >= 1.5x transformers at lower P99 TTFT; per step ours <= 1.1x.
``--record`` writes longctx/data/recorded/throughput_cpu.json with provenance.

Noise: the course VM has 2 cores shared by several people at once; other processes change step times by
2x or more between runs, so the ratios are more trustworthy than the absolute numbers (the per-step
timings alternate ours / transformers so that load drifts hit both). The numbers recorded in
throughput_cpu.json are what one run measured; see its provenance (load average 7-11 on 2 cores).

Measured 2026-12-01, course VM, 1 thread, torch 2.13.0, transformers 5.24.0, 48 requests (37-270 prompt
tokens, 3,765 answer tokens in all):

    workload      engine                      tok/s  TTFT mean  TTFT P99  E2E mean  E2E P99   (s)
    serving 2/s   ours (chunked 256)           32.6      14.58     28.92     73.73    97.94
                  transformers (static <=16)   16.7     108.88    172.83    134.03   201.24   ratio 1.94x
    all-at-once   ours (chunked 256)           28.6      21.58     50.67     96.00   126.31
                  transformers (static <=16)   18.1     104.26    158.19    129.61   199.27   ratio 1.58x

(An earlier run of the same workloads, before the in-place read below, at load average ~10: serving
38.0 vs 21.9 tok/s, 1.74x, P99 TTFT 21.8 vs 122 s; all at once 45.8 vs 17.9 tok/s, 2.56x: the absolute
numbers move with the load, the ratios stay well above 1.5x.)

      B  context   ours ms  transformers ms   ratio   (load average 4.7)
      1      512      93.5             97.0    0.96
      8      512     201.3            194.8    1.03
     16      512     307.4            300.1    1.02
      1     2048     125.2            137.3    0.91
      8     2048     383.2            382.9    1.00
     16     2048     655.3            695.0    0.94

Both targets are met in this run: serving throughput 1.94x at P99 TTFT 28.9 s vs 173 s; every
per-step point <= 1.1x. What it took (profile of the B = 16 x 2K step): Python overhead was never the
cost (metadata and bookkeeping < 1 % of the step); the copy of the paged KV cache was. Decode attention
first gathered each key slot (aten::index: 65 % of a 5.8 s step under load, 2.9x transformers), then
whole blocks (index_select: 2.5 s, still 1.9-3.2x), and now reads a sequence whose blocks are
consecutive in place (a slice of the pool: one SDPA call per sequence on a CPU, no copy), which is the
benchmark's case. Sequences whose blocks are scattered (common after many decode steps of continuous
batching) still pay the block copy: transformers copies its dense cache each step too (torch.cat), so
that case costs about the same per byte, but a paged kernel that reads the block table in place (vLLM's)
would be needed to remove it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from hf_baseline import load_hf, serve_hf, step_hf  # the transformers side (this folder)

from longctx.provenance import git_commit, load_gate, machine

RECORD = Path(__file__).resolve().parents[1] / "longctx" / "data" / "recorded" / "throughput_cpu.json"
TOPICS = ["photosynthesis", "the French revolution", "prime numbers", "how a refrigerator works", "tides",
          "the water cycle", "black holes", "compound interest", "vaccines", "the printing press"]
DOC = ("The committee met on Tuesday to review the annual budget. It approved the road repairs, postponed "
       "the library extension, and asked for a new estimate of the heating costs. ")


def workload(tok, n: int, rate: float, seed: int) -> list[dict]:
    """Seeded requests: arrival_s (Poisson, or 0 when rate is inf), prompt ids, max_tokens."""
    rng = np.random.default_rng(seed)
    gaps = np.zeros(n) if np.isinf(rate) else rng.exponential(1 / rate, n)
    arrivals = np.cumsum(gaps) - gaps[0]
    out = []
    for i in range(n):
        doc = DOC * int(rng.integers(0, 8))  # 0-7 pasted paragraphs: ~30 to ~330 prompt tokens
        q = f"{doc}Explain {TOPICS[i % len(TOPICS)]} in a few sentences."
        out.append({"arrival_s": float(arrivals[i]), "ids": tok.encode_chat(q),
                    "max_tokens": int(rng.integers(16, 129))})
    return out


def summary(reqs: list[dict], wall_s: float) -> dict:
    ttft = [r["times"][0] - r["arrival_s"] for r in reqs]
    e2e = [r["times"][-1] - r["arrival_s"] for r in reqs]
    tokens = sum(len(r["times"]) for r in reqs)
    return {"tokens": tokens, "wall_s": wall_s, "throughput_tok_s": tokens / wall_s,
            "ttft_mean_s": float(np.mean(ttft)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "e2e_mean_s": float(np.mean(e2e)), "e2e_p99_s": float(np.percentile(e2e, 99))}


def serve_ours(model, reqs, token_budget: int) -> dict:
    from longctx.engine import ChunkedPrefillScheduler, Engine, TorchExecutor, WallClock
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens

    blocks = sum(blocks_for_tokens(len(r["ids"]) + r["max_tokens"], 16) for r in reqs)
    clock = WallClock()
    engine = Engine(TorchExecutor(model, BlockManager(blocks, 16)), ChunkedPrefillScheduler(token_budget),
                    clock=clock)
    clock.reset()
    seqs = [engine.add_request(r["ids"], r["max_tokens"], arrival_s=r["arrival_s"]) for r in reqs]
    engine.run_until_done()
    done = [{"arrival_s": s.arrival_s, "times": s.token_times_s} for s in seqs]
    return summary(done, clock.now()) | {"steps": len(engine.history)}


def step_ours(model, batch_size: int, context: int):
    """One decode step of ``batch_size`` sequences holding ``context`` cached tokens each (a function)."""
    from longctx.engine import ScheduledBatch, Sequence, SequenceStatus, TorchExecutor
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens

    bm = BlockManager(batch_size * blocks_for_tokens(context + 1, 16), 16)
    ex = TorchExecutor(model, bm)
    ex.cache.data.normal_()  # the values do not change the cost
    seqs = []
    for i in range(batch_size):
        s = Sequence(i, [1] * context, max_tokens=8, status=SequenceStatus.RUNNING)
        s.output_token_ids, s.num_computed_tokens = [5], context  # a decode: the last token is uncomputed
        seqs.append(s)

    def one_step():
        batch = ScheduledBatch(bm, seqs)
        for s in seqs:
            batch.add(s, 1)
        ex.execute(batch)

    return one_step


def interleaved_medians(fns, repeats: int) -> list[float]:
    """Median seconds of each function, timed in turns (ABAB...) so that load drifts hit both alike."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times, strict=True):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [statistics.median(ts) for ts in times]


def provenance(threads: int) -> dict:
    import torch

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"), "machine": machine(),
        "load_average_1min": os.getloadavg()[0], "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "python": platform.python_version(),
        "threads": threads, "dtype": "float32", "commit": git_commit() or "",
        "produced_by": "benchmarks/throughput.py",
    }


def _parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--token-budget", type=int, default=256, help="our chunked scheduler's token budget")
    p.add_argument("--hf-batch", type=int, default=16, help="largest static batch for transformers")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per step measurement")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--skip", nargs="*", default=[], choices=["serving", "all-at-once", "steps"])
    p.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    p.add_argument("--force", action="store_true", help="record despite the load (marks the record unusable)")
    return p


def _per_step(ours, hf, args) -> list[dict]:
    """One decode step of each engine at each batch size and context (interleaved medians), printed."""
    steps = []
    print(f"\n{'B':>3}{'context':>9}{'ours ms':>10}{'transformers ms':>17}{'ratio':>8}  target <= 1.1x")
    for ctx in args.contexts:
        for bsz in args.batches:
            o, h = interleaved_medians([step_ours(ours, bsz, ctx), step_hf(hf, bsz, ctx)], args.repeats)
            steps.append({"batch": bsz, "context": ctx, "ours_s": o, "transformers_s": h, "ratio": o / h})
            print(f"{bsz:>3}{ctx:>9}{1e3 * o:>10.1f}{1e3 * h:>17.1f}{o / h:>8.2f}  "
                  f"{'ok' if o / h <= 1.1 else 'over'}")
    return steps


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.record:
        load_gate(args.threads, args.force)
    import torch

    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    ours, hf = load_model(), load_hf()
    result = {"config": vars(args) | {"skip": list(args.skip)}, "provenance": provenance(args.threads)}
    rows = []
    for name, rate in (("serving", args.rate), ("all-at-once", float("inf"))):
        if name in args.skip:
            continue
        reqs = workload(tok, args.requests, rate, args.seed)
        a = serve_ours(ours, reqs, args.token_budget)
        b = summary(*serve_hf(hf, reqs, args.hf_batch))
        result[name] = {"ours": a, "transformers_static_batches": b,
                        "throughput_ratio": a["throughput_tok_s"] / b["throughput_tok_s"],
                        "prompt_tokens": [len(r["ids"]) for r in reqs],
                        "max_tokens": [r["max_tokens"] for r in reqs]}
        rows.append((name, a, b))
    print(f"SmolLM2-135M fp32, {args.requests} requests, torch {torch.__version__}, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'workload':<13}{'engine':<26}{'tok/s':>8}{'TTFT mean':>11}{'TTFT P99':>10}{'E2E mean':>10}"
          f"{'E2E P99':>9}")
    for name, a, b in rows:
        label = f"{name} ({args.rate:g}/s)" if name == "serving" else name
        for eng, m in (
            (f"ours (chunked {args.token_budget})", a),
            (f"transformers (static <={args.hf_batch})", b),
        ):
            print(f"{label:<13}{eng:<26}{m['throughput_tok_s']:>8.1f}{m['ttft_mean_s']:>11.2f}"
                  f"{m['ttft_p99_s']:>10.2f}{m['e2e_mean_s']:>10.2f}{m['e2e_p99_s']:>9.2f}")
            label = ""
        print(
            f"{'':<13}throughput ratio ours / transformers: "
            f"{a['throughput_tok_s'] / b['throughput_tok_s']:.2f}x"
        )
    if "steps" not in args.skip:
        result["per_step"] = _per_step(ours, hf, args)
    if args.record:
        if args.skip and RECORD.exists():  # keep the parts this run skipped, with their own provenance
            old = json.loads(RECORD.read_text())
            for part in args.skip:
                key = "per_step" if part == "steps" else part
                if key in old:
                    result[key] = old[key]
                    result[f"{key}_provenance"] = old.get(f"{key}_provenance", old.get("provenance"))
        RECORD.parent.mkdir(parents=True, exist_ok=True)
        RECORD.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
