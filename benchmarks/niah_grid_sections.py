"""The measuring sections of ``benchmarks/niah_grid.py`` (its module docstring): the needle trials of the grid
and ``beyond`` sections (``run_trials``, under each RoPE variant of ``VARIANTS``), ``depth1``
(``run_depth_one``), ``perplexity`` (``run_perplexity``) and ``entropy`` (``run_entropy``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from niah_grid_records import now, open_record, trial_key, trial_seed, write_record

from longctx.provenance import wait_for_quiet

FACTOR = 2.0
TRAINED = 8192
VARIANTS = {
    "none": None, "linear": {"rope_type": "linear", "factor": FACTOR},
    "ntk": {"rope_type": "ntk", "factor": FACTOR},
    "yarn": {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": TRAINED},
}


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


def run_perplexity(out: Path, model, tok, meta: dict, lengths: list[int], variants: list[str]) -> None:
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


def run_entropy(out: Path, model, tok, meta: dict, lengths: list[int]) -> None:
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
