"""What KV pruning costs SmolLM2-135M (CPU, fp32), press by press and ratio by ratio, with provenance.

Sections (each writes ``longctx/data/recorded/kv_pruning_<section>.json`` after EVERY trial, so an
interrupted run keeps what it finished; a rerun skips what is recorded):

- ``niah``    needle accuracy and answer log-probability on lesson 05's passkey haystack at 1,024 tokens
              (where the unpruned model finds the needle), every press x ratio, question-aware (the question
              inside SnapKV's window) and, for SnapKV, question-agnostic (pruned before the question);
              StreamingLLM with 4 sinks (the paper) and 32 (the source's advice).
- ``ppl``     mean NLL of 128 tokens of natural text after a 1,024-token context whose cache was pruned
              (``longctx.evals.forcing.continuation_nll``), at three offsets in the text; reported as
              perplexity and as the change against the unpruned cache.
- ``memory``  the engine's blocks and KV bytes held after a 1,024-token prefill, and one decode step's
              time over the pruned cache, per ratio (the press does not matter for either).

Usage (one CPU thread; about 40 minutes for all three on a busy 2-core machine)::

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/kv_pruning.py all > /tmp/kv.log &
    .venv/bin/python benchmarks/kv_pruning.py niah --ratios 0.5 --presses snapkv --seeds 1 --out /tmp/x.json

Prints a table per section when done.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

from niah_grid import RECORDED, _load_or_new, provenance

PRESSES = ("streaming_llm", "snapkv", "h2o", "knorm", "random")
RATIOS = "0.25,0.5,0.68,0.8,0.9"
LENGTH = 1024


def _configs(presses, ratios):
    """(label fields) for every pruned configuration, plus the unpruned baseline first."""
    out = [("none", 0.0, True, {})]
    for name in presses:
        for r in ratios:
            out.append((name, r, True, {}))
            if name == "snapkv":
                out.append((name, r, False, {}))
            if name == "streaming_llm":
                out.append((name, r, True, {"n_sink": 32}))
    return out


def _press(name, ratio, options):
    from longctx.kv.press import make_press

    return None if name == "none" else make_press(name, ratio, **options)


def _label(name, ratio, aware, options):
    if name == "none":
        return "none"
    extra = "".join(f" {k}={v}" for k, v in options.items())
    return f"{name} {ratio:g}{extra}" + ("" if aware else " agnostic")


def run_niah(out, model, tok, meta, configs, depths, seeds, length):
    from tqdm import tqdm

    from longctx.evals.niah import NiahRunner

    table = _load_or_new(out, meta)
    done = {(r["press_config"], r["depth"], r["seed"]) for r in table.rows}
    cells = [(c, d, s) for s in seeds for c in configs for d in depths]
    for (name, ratio, aware, options), d, s in tqdm(cells, desc="niah"):
        label = _label(name, ratio, aware, options)
        if (label, d, s) in done:
            continue
        runner = NiahRunner(model, tok, max_tokens=length + 64, press=_press(name, ratio, options),
                            question_aware=aware)
        t0 = time.perf_counter()
        row = runner.trial(length, d, s, "passkey").to_dict()
        row.update(press_config=label, press_name=name, ratio=ratio, aware=aware, trial_s=time.perf_counter() - t0,
                   n_sink=options.get("n_sink", 4 if name == "streaming_llm" else None))
        table.append(row)
        table.meta["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        table.save(out)
    return table


def run_ppl(out, model, tok, meta, configs, length, offsets=(0, 3000, 6000), continuation=128):
    from tqdm import tqdm

    from longctx.evals.forcing import continuation_nll
    from longctx.evals.haystack import natural_text

    ids = tok.encode(natural_text())
    data = json.loads(out.read_text()) if out.exists() else {"meta": meta, "rows": []}
    done = {(r["press_config"], r["offset"]) for r in data["rows"]}
    for c in tqdm([c for c in configs if c[2]], desc="ppl"):  # question-agnostic means nothing here
        for off in offsets:
            label = _label(*c)
            if (label, off) in done:
                continue
            ctx, cont = ids[off : off + length], ids[off + length : off + length + continuation]
            t0 = time.perf_counter()
            nll = continuation_nll(model, ctx, cont, _press(c[0], c[1], c[3]))
            data["rows"].append({"press_config": label, "press_name": c[0], "ratio": c[1], "offset": off,
                                 "context_tokens": len(ctx), "continuation_tokens": len(cont), "nll": nll,
                                 "seconds": time.perf_counter() - t0,
                                 "n_sink": c[3].get("n_sink", 4 if c[0] == "streaming_llm" else None)})
            data["meta"]["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def run_memory(out, model, tok, meta, ratios, length, decode_steps=24):
    import torch

    from longctx.engine import Engine, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.evals.haystack import natural_text
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens
    from longctx.kv.press import make_press
    from longctx.memory import kv_bytes_per_token

    ids = tok.encode(natural_text())[:length]
    c = model.config
    bytes_per_token = kv_bytes_per_token(c, "fp32")  # the engine's cache is in the model's dtype, fp32
    rows = []
    for ratio in [0.0, *ratios]:
        press = make_press("knorm", ratio)
        pool = BlockManager(blocks_for_tokens(length + decode_steps + 1, 16), 16)
        engine = Engine(TorchExecutor(model, pool, press=press), MonolithicScheduler(), max_model_len=c.max_context)
        seq = engine.add_request(ids, decode_steps + 1)
        engine.step()  # the prefill, then the press
        held, kv_tokens = len(pool.block_table(seq.seq_id)), seq.num_cached_tokens
        steps = []
        while engine.has_unfinished():
            steps.append(engine.step().duration_s)
        rows.append({"ratio": ratio, "kv_tokens": kv_tokens,
                     "blocks_held": held, "blocks_unpruned": blocks_for_tokens(length, 16),
                     "kv_bytes_held": held * 16 * bytes_per_token, "decode_step_s": statistics.median(steps),
                     "threads": torch.get_num_threads()})
        print(f"ratio {ratio:4.2f}: {held:3d} blocks, decode step {1e3 * rows[-1]['decode_step_s']:.1f} ms", flush=True)
    out.write_text(json.dumps({"meta": meta, "bytes_per_token": bytes_per_token, "rows": rows}, indent=1) + "\n")
    return rows


def print_niah(table) -> None:
    groups: dict[str, list] = {}
    for r in table.rows:
        groups.setdefault(r["press_config"], []).append(r)
    print(f"\nniah passkey, {LENGTH} tokens: accuracy / mean log p(answer) per configuration")
    for label, rows in groups.items():
        acc = sum(r["correct"] for r in rows) / len(rows)
        lp = sum(r["answer_logprob"] for r in rows) / len(rows)
        print(f"{label:<34} {acc:5.2f}  {lp:7.2f}   ({len(rows)} trials)")


def print_ppl(data) -> None:
    import math

    by = {}
    for r in data["rows"]:
        by.setdefault(r["press_config"], []).append(r["nll"])
    base = statistics.mean(by.get("none", [float("nan")]))
    print("\ncontinuation of natural text after a pruned 1,024-token context: perplexity (change vs full cache)")
    for label, v in by.items():
        m = statistics.mean(v)
        print(f"{label:<34} {math.exp(m):8.2f}  {100 * (math.exp(m - base) - 1):+7.1f} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=["niah", "ppl", "memory", "all"])
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--ratios", default=RATIOS)
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--length", type=int, default=LENGTH)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="one section: write here instead")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model, tok = load_model(), load_tokenizer()
    meta = provenance(args.threads)
    ratios = [float(x) for x in args.ratios.split(",")]
    configs = _configs(args.presses.split(","), ratios)
    sections = ["niah", "ppl", "memory"] if args.section == "all" else [args.section]
    for section in sections:
        out = args.out or RECORDED / f"kv_pruning_{section}.json"
        if section == "niah":
            print_niah(run_niah(out, model, tok, meta, configs, [float(x) for x in args.depths.split(",")],
                                range(args.seeds), args.length))
        elif section == "ppl":
            print_ppl(run_ppl(out, model, tok, meta, configs, args.length))
        else:
            run_memory(out, model, tok, meta, ratios, args.length)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
