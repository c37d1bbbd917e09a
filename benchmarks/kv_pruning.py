"""What KV pruning costs SmolLM2-135M (CPU, fp32), press by press and ratio by ratio, and why SnapKV loses
the needle: recorded with provenance, resumable.

Sections (each writes ``longctx/data/recorded/kv_pruning_<section>.json`` as it goes; a rerun skips what is
recorded):

- ``niah``    passkey needle at 1,024 tokens. Each trial (its own seed: needle value, filler offset, and the
              random press's draws) is prefilled ONCE (``longctx.evals.pruned.PrefillSnapshot``) and that
              prefill serves every configuration, batched (``PrunedScorer.answer_many``): every press x
              ratio question-aware; SnapKV and H2O question-agnostic too; StreamingLLM with 32 sinks; H2O
              with kvpress's per-query normalisation (``h2o_mean``); and the causal account of SnapKV's
              losses: SnapKV with the needle's tokens force-kept at the same budget
              (``snapkv_force_needle``), and transplants of exactly SnapKV's choice of needle tokens (per
              layer and KV head) into presses that otherwise decide: random (``random_snapkv_needle``),
              random with token 0 kept (``random_sink_snapkv_needle``, against its control
              ``random_sink``: random alone loses the attention sink) and key norm (``knorm_snapkv_needle``).
              Rows carry per-token answer log-probabilities, the model's top
              token at each answer position, and how many needle tokens each layer's KV heads kept; the
              full per-token retention maps of the first trials go to ``kv_pruning_retention.json``.
              Needle depths are checked against every window edge (StreamingLLM's 4- and 32-sink recent
              windows, H2O's recent half) so that no needle straddles one.
- ``ppl``     mean NLL of 128 tokens of natural text after a 1,024-token context whose cache was pruned, at
              three offsets, one prefill per offset for every press; random over 5 seeds per offset.
- ``random-sink``  why the old random baseline's perplexity was not monotonic: the old fixed mask (one
              seeded draw reused by every layer) against per-layer draws, each with and without token 0
              (the attention sink) force-kept, over 10 mask seeds.
- ``memory``  the engine's blocks and KV bytes held after a 1,024-token prefill, and one decode step's time.

Load and provenance as in ``niah_grid.py``: refuses to start above ``--threads`` of one-minute load average,
pauses while others load the machine, ``--force`` marks the record unusable.

Usage (one CPU thread, in the background)::

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/kv_pruning.py niah > /tmp/kv.log 2>&1 &
    .venv/bin/python benchmarks/kv_pruning.py niah --ratios 0.5 --trials 1 --out /tmp/x.json --force
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from kv_pruning_configs import (  # noqa: F401 (re-exported: tests read them)
    EDGE_MARGIN,
    Config,
    check_placement,
    niah_configs,
    window_edges,
)
from kv_pruning_sections import run_memory, run_niah, run_ppl, run_random_sink
from niah_grid import RECORDED, load_gate, now, provenance

PRESSES = ("streaming_llm", "snapkv", "h2o", "knorm", "random")
RATIOS = "0.25,0.5,0.68,0.8,0.9"
DEPTHS = "0.1,0.4,0.79"  # every window edge >= 8 tokens away (0.5: the needle began at the 4-sink edge, 516)
LENGTH = 1024


def print_niah(data) -> None:
    from longctx.evals.stats import Rate

    groups: dict[str, list] = {}
    for r in data["rows"]:
        groups.setdefault(r["press_config"], []).append(r)
    print(f"\nniah passkey, {LENGTH} tokens: accuracy [95 % Wilson] / mean log p(answer) per configuration")
    for label, rows in groups.items():
        lp = sum(r["answer_logprob"] for r in rows) / len(rows)
        print(f"{label:<40} {Rate.of(r['correct'] for r in rows)!s:<30} {lp:7.2f}")


def print_ppl(data) -> None:
    import math

    by: dict[str, list] = {}
    for r in data["rows"]:
        by.setdefault(r["press_config"], []).append(r["nll"])
    base = statistics.mean(by.get("none", [float("nan")]))
    print(
        "\ncontinuation of natural text after a pruned 1,024-token context: perplexity (change vs full cache)"
    )
    for label, v in by.items():
        m = statistics.mean(v)
        print(f"{label:<34} {math.exp(m):8.2f}  {100 * (math.exp(m - base) - 1):+7.1f} %   ({len(v)} runs)")


def print_random_sink(data) -> None:
    import math

    by: dict = {}
    for r in data["rows"]:
        by.setdefault((r["ratio"], r["variant"]), []).append(r)
    print("\nrandom pruning: perplexity change vs the full cache (mean over offsets and mask seeds); masks "
          "evicting token 0 in at least one (layer, KV head)")
    for (ratio, variant), rows in sorted(by.items()):
        change = statistics.mean(math.exp(r["nll"] - r["nll_full_cache"]) - 1 for r in rows)
        sink = sum(r["sink_evicted_layer_heads"] > 0 for r in rows)
        print(f"{ratio:4.2f} {variant:<15} {100 * change:+8.1f} %   sink evicted in {sink}/{len(rows)} runs")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=["niah", "ppl", "random-sink", "memory", "all"])
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--ratios", default=RATIOS)
    ap.add_argument("--depths", default=DEPTHS)
    ap.add_argument("--trials", type=int, default=10, help="independent trials per depth (niah)")
    ap.add_argument("--length", type=int, default=LENGTH)
    ap.add_argument(
        "--seeds", type=int, default=None, help="random masks per point (ppl: 5, random-sink: 10)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--force", action="store_true", help="record despite the load (marks the record unusable)"
    )
    ap.add_argument("--out", type=Path, default=None, help="one section: write here instead")
    args = ap.parse_args(argv)
    gate_load = load_gate(args.threads, args.force)

    import torch

    torch.set_num_threads(args.threads)
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model, tok = load_model(), load_tokenizer()
    meta = provenance(args.threads, usable=not args.force, gate_load=gate_load)
    ratios = [float(x) for x in args.ratios.split(",")]
    presses = args.presses.split(",")
    sections = ["niah", "ppl", "random-sink", "memory"] if args.section == "all" else [args.section]
    gate = (args.threads, args.force)
    for section in sections:
        out = args.out or RECORDED / f"kv_pruning_{section.replace('-', '_')}.json"
        if section == "niah":
            print_niah(run_niah(out, model, tok, meta, niah_configs(presses, ratios),
                                [float(x) for x in args.depths.split(",")], range(args.trials), args.length,
                                ratios, *gate))
        elif section == "ppl":
            print_ppl(run_ppl(out, model, tok, meta, presses, ratios, args.length, *gate,
                              random_seeds=args.seeds or 5))
        elif section == "random-sink":
            print_random_sink(
                run_random_sink(
                    out, model, tok, meta, [r for r in ratios if r <= 0.68], args.length, *gate,
                    seeds=args.seeds or 10,
                )
            )
        else:
            run_memory(out, model, tok, meta, ratios, args.length)
        print(f"wrote {out} ({now()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
