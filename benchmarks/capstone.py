"""The capstone's measurements: KV precision and prefix caching on SmolLM2 in the engine, and 64 users x 8K
tokens in a 48 GiB KV pool at H100 scale in the simulator. Each section writes
``longctx/data/recorded/capstone_<section>.json`` (with provenance) and prints its table.

- ``bytes``    the pool's real bytes per token (``PagedKVCache.nbytes``) per KV dtype, against the planner
               (``longctx.kv.quant.pool_bytes_per_token``) and the element-only textbook number.
- ``quality``  2,048 tokens of natural text teacher-forced in chunks of 512 (later chunks read the cache back
               quantized): max and mean |Δlogit| against the fp32 cache, perplexity and its change, per dtype.
- ``niah``     lesson 05's passkey haystack at 1,024 and 2,048 tokens, prefilled in chunks of 512, the answer
               read over the cache: accuracy and answer log-probability per KV dtype.
- ``prefix``   a 2,048-token shared system prompt: the engine's TTFT for the first request (cold) and the
               next ones (the cache hit), blocks shared, and greedy outputs with and without the cache.
- ``sim``      the capstone's load test (``longctx.sim.loadtest``): Llama-2-7B / Llama-3-8B x bf16 / fp8 x no
               prefix cache / 2K shared prefix on a simulated H100 with a 48 GiB pool, 64 users of 7,168 +
               1,024 tokens arriving within 2 s, so that all 64 are resident at once where the pool holds
               them: per configuration the most requests running in one step (``peak_running``), peak blocks
               against the plan, preemptions, TTFT and ITL percentiles, and the verdict; then what same-step
               prefix sharing changes (``same_step``).

The model sections (``quality``, ``niah``, ``prefix``) refuse to start when the one-minute load average
exceeds the ``--threads`` they use (``niah_grid.load_gate``); ``--force`` records anyway, marked unusable.
``bytes`` and ``sim`` are exempt (``UNGATED``): they time nothing on this machine (``bytes`` counts allocated
bytes, ``sim`` runs on the simulator's virtual clock), so their results do not depend on the load; their
records still carry the load average at the start (``load_average_1min_start``) and say why no gate applied
(``load_gate``).

Usage::

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/capstone.py all          # about 10 minutes on 2 cores
    .venv/bin/python benchmarks/capstone.py sim --out /tmp/sim.json         # one section, elsewhere
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from capstone_tables import DTYPES, table
from niah_grid import RECORDED, load_gate, provenance

CHUNK = 512
# Sections whose results time nothing on this machine: the load gate does not apply (module docstring).
UNGATED = {"bytes": "exempt: counts allocated bytes, times nothing",
           "sim": "exempt: simulated on a virtual clock, times nothing on this machine"}


def _write(out: Path, data: dict) -> dict:
    data["meta"]["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out.write_text(json.dumps(data, indent=1) + "\n")
    return data


def run_bytes(out, meta, **_):
    from longctx.kv.cache import PagedKVCache
    from longctx.kv.quant import pool_bytes_per_token
    from longctx.memory import kv_bytes_per_token
    from longctx.specs import get_model

    rows = []
    for name in ("smollm2-135m", "llama-2-7b", "llama-3-8b"):
        for kv in DTYPES:
            measured = None
            if name == "smollm2-135m":  # allocate the real pool (64 blocks of 16 tokens)
                measured = PagedKVCache.for_model(get_model(name), 64, 16, kv_dtype=kv).nbytes // (64 * 16)
            rows.append({"model": name, "kv_dtype": kv, "pool_bytes_per_token_measured": measured,
                         "pool_bytes_per_token_planned": pool_bytes_per_token(name, kv),
                         "element_bytes_per_token": kv_bytes_per_token(name, kv)})
    return _write(out, {"meta": meta, "rows": rows})


def run_quality(out, meta, model, tok, length=2048, **_):
    import torch

    from longctx.evals.forcing import forward_at
    from longctx.evals.haystack import natural_text
    from longctx.kv.cache import PagedKVCache

    ids = tok.encode(natural_text())[:length]
    nb = -(-length // 16)
    table = list(range(nb))
    target = torch.tensor(ids[1:] + [0])
    caches = {kv: PagedKVCache.for_model(model.config, nb, 16, kv_dtype=kv) for kv in DTYPES}
    nll = {kv: [] for kv in DTYPES}
    max_d = dict.fromkeys(DTYPES, 0.0)
    sum_d = dict.fromkeys(DTYPES, 0.0)
    t0 = time.perf_counter()
    for start in range(0, length, CHUNK):  # all dtypes in lockstep, one chunk at a time (bounded memory)
        stop = min(length, start + CHUNK)
        ref = None
        for kv in DTYPES:
            logits = forward_at(model, caches[kv], table, ids[start:stop], start, list(range(stop - start)))
            lp = torch.log_softmax(logits, -1)
            nll[kv] += (-lp.gather(1, target[start:stop, None])[:, 0]).tolist()
            if ref is None:
                ref = logits
            diff = (logits - ref).abs().max(-1).values  # [chunk]
            max_d[kv] = max(max_d[kv], float(diff.max()))
            sum_d[kv] += float(diff.sum())
    rows = []
    base = None
    for kv in DTYPES:
        values = nll[kv][: length - 1]
        ppl = float(torch.tensor(values).mean().exp())
        base = base or ppl
        later = values[CHUNK:]  # positions whose chunk read earlier keys back from the cache
        rows.append({"kv_dtype": kv, "tokens": length, "chunk": CHUNK, "perplexity": ppl,
                     "perplexity_change": ppl / base - 1, "max_abs_dlogit": max_d[kv],
                     "mean_max_abs_dlogit_per_token": sum_d[kv] / length,
                     "perplexity_after_first_chunk": float(torch.tensor(later).mean().exp())})
    meta["seconds"] = time.perf_counter() - t0
    return _write(out, {"meta": meta, "rows": rows})


def run_niah(
    out, meta, model, tok, lengths=(1024, 2048), depths=(0.1, 0.3, 0.5, 0.7, 0.9), seeds=(0, 1), **_
):
    from tqdm import tqdm

    from longctx.evals.niah import NiahRunner

    data = json.loads(out.read_text()) if out.exists() else {"meta": meta, "rows": []}
    done = {(r["kv_dtype"], r["length"], r["depth"], r["seed"]) for r in data["rows"]}
    cells = [(kv, n, d, s) for n in lengths for kv in DTYPES for d in depths for s in seeds]
    runners = {}
    for kv, n, d, s in tqdm(cells, desc="niah", file=sys.stderr):
        if (kv, n, d, s) in done:
            continue
        if (kv, n) not in runners:
            runners[(kv, n)] = NiahRunner(model, tok, max_tokens=n + 64, kv_dtype=kv, chunk_size=CHUNK)
        t = runners[(kv, n)].trial(n, d, s)
        data["rows"].append({"kv_dtype": kv, "length": n, "depth": d, "seed": s, "correct": t.correct,
                             "answer_logprob": t.answer_logprob, "output": t.output})
        _write(out, data)
    return data


def run_prefix(out, meta, model, tok, system_tokens=2048, max_tokens=16, **_):
    """Three requests share a 2,048-token system prompt. ``sequential``: one after the other, so the second
    and third find it cached (TTFT cold vs warm, outputs with and without the cache). ``together``: after
    one warm-up request, two arrive at once and hold the same blocks (reference count 2)."""
    from longctx.engine import ChunkedPrefillScheduler, Engine
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.evals.haystack import natural_text
    from longctx.kv.block_manager import BlockManager
    from longctx.memory import blocks_for_tokens

    system = tok.encode(natural_text())[:system_tokens]
    questions = ["\nQuestion: who wrote this? Answer:", "\nQuestion: what is the main idea? Answer:",
                 "\nQuestion: summarise the first sentence. Answer:"]
    prompts = [system + tok.encode(q) for q in questions]

    def engine(kv, caching):
        num_blocks = sum(blocks_for_tokens(len(p) + max_tokens, 16) for p in prompts)
        bm = BlockManager(num_blocks, 16, enable_prefix_caching=caching)
        return Engine(TorchExecutor(model, bm, kv_dtype=kv), ChunkedPrefillScheduler(CHUNK),
                      vocab_size=model.config.vocab_size), bm

    rows = []
    for kv in ("fp32", "fp8"):
        outputs = {}
        for caching in (False, True):
            eng, bm = engine(kv, caching)
            outs = []
            for i, p in enumerate(prompts):  # one after the other: the first warms the cache
                t0 = time.perf_counter()
                seq = eng.add_request(p, max_tokens)
                while not seq.output_token_ids:
                    eng.step()
                ttft = time.perf_counter() - t0
                eng.run_until_done()
                outs.append(seq.output_token_ids)
                rows.append({"kv_dtype": kv, "mode": "sequential", "prefix_caching": caching, "request": i,
                             "prompt_tokens": len(p), "prefix_cached_tokens": seq.num_prefix_cached_tokens,
                             "blocks_from_cache": seq.num_prefix_cached_tokens // 16, "ttft_s": ttft})
            outputs[caching] = outs
        same = outputs[True] == outputs[False]
        for r in rows:
            if r["kv_dtype"] == kv:
                r["outputs_identical_with_and_without_cache"] = same
        eng, bm = engine(kv, True)
        eng.add_request(prompts[0], max_tokens)
        eng.run_until_done()
        pair = [eng.add_request(p, max_tokens) for p in prompts[1:]]
        used_before = bm.num_used_blocks
        eng.step()  # both admitted in this step: each takes the 128 cached blocks
        table = bm.block_table(pair[0].seq_id)
        rows.append({
            "kv_dtype": kv, "mode": "together", "prefix_caching": True, "request": 1,
            "prompt_tokens": len(prompts[1]), "prefix_cached_tokens": pair[1].num_prefix_cached_tokens,
            "blocks_from_cache": pair[1].num_prefix_cached_tokens // 16,
            "blocks_shared_by_both": sum(1 for b in table if bm.ref_count(b) == 2),
            "blocks_held_by_both": bm.num_used_blocks - used_before, "ttft_s": None})
        eng.run_until_done()
    return _write(out, {"meta": meta, "rows": rows})


CONFIGS = [(m, kv, c) for m in ("llama-2-7b", "llama-3-8b") for kv in ("bf16", "fp8") for c in (False, True)]


def _same_step_tests() -> dict:
    """The traffics of the same-step sharing intervention (name -> ``LoadTest``)."""
    from dataclasses import replace

    from longctx.sim.loadtest import CAPSTONE

    return {
        "capstone": CAPSTONE, "capstone_at_t0": replace(CAPSTONE, arrival_window_s=0.0),
        "chat_at_t0": replace(CAPSTONE, prompt_tokens=2_048 + 128, output_tokens=256, arrival_window_s=0.0),
    }


def run_sim(out, meta, **_):
    """The load test (``longctx.sim.loadtest.CAPSTONE``) for every configuration, then the same-step sharing
    intervention: Llama-3-8B fp8 with the prefix cache, blocks registered when scheduled (ours, vLLM's) or
    only after the step computed them, for the capstone's arrivals, for all 64 at t = 0, and for a chat
    burst (64 x the 2,048-token system prompt + 128 own tokens, 256 outputs, all at t = 0)."""
    from longctx.sim.loadtest import CAPSTONE, describe, run_load_test

    rows = []
    for model, kv, caching in CONFIGS:
        row = run_load_test(model, kv, caching)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    same_step = []
    for name, test in _same_step_tests().items():
        for sharing in (True, False):
            r = run_load_test("llama-3-8b", "fp8", True, test, same_step_sharing=sharing)
            same_step.append({"traffic": name, "test": describe(test), **r})
    meta = {
        **meta,
        "model": "none: the simulator (longctx.sim cost model, virtual clock)",
        "hardware": "h100 (simulated)",
        "load_test": describe(CAPSTONE),
        "n": len(rows),
        "kv_scales": "the engine's (fp8: one fp16 scale per vector; bf16: none)",
        "passes_when": "peak_running >= users, no preemption, TTFT P99 <= ttft_p99_s "
        "and ITL P99 <= itl_p99_s",
        "why_these_lengths": (
            "64 arrivals in 2 s and 1,024 output tokens: prefilling the 64 prompts takes a few "
            "seconds at a budget of 8,192 tokens, decoding 1,024 tokens about 20 s, so every user "
            "is still decoding when the last one starts: all 64 resident at once if the pool "
            "holds them"
        ),
    }
    return _write(out, {"meta": meta, "rows": rows, "same_step": same_step})


SECTIONS = {
    "bytes": run_bytes, "quality": run_quality, "niah": run_niah, "prefix": run_prefix, "sim": run_sim,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=[*SECTIONS, "all"])
    ap.add_argument("--out", type=Path, default=None, help="output JSON (default: the recorded file)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true",
                    help="record even when the machine is busy (the record is marked usable: false)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sections = list(SECTIONS) if args.section == "all" else [args.section]
    model = tok = None
    for section in sections:
        out = args.out or RECORDED / f"capstone_{section}.json"
        cores = 1 if section in UNGATED else args.threads  # the simulator is one Python thread
        if section in UNGATED:  # its result does not depend on the load: recorded whatever it is
            load = os.getloadavg()[0]
            meta = {**provenance(cores, usable=True, gate_load=load), "cores_used": cores,
                    "load_gate": UNGATED[section]}
        else:
            load = load_gate(cores, args.force)
            meta = {**provenance(cores, usable=load <= cores, gate_load=load), "cores_used": cores,
                    "load_gate": f"one-minute load <= {cores} core(s)"}
        if model is None and section not in ("bytes", "sim"):
            from longctx.model.tokenizer import load_tokenizer
            from longctx.model.weights import load_model

            model, tok = load_model(), load_tokenizer()
        data = SECTIONS[section](out, meta, model=model, tok=tok)
        print(f"\n== {section} ({out})\n{table(section, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
