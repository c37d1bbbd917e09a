"""Gemma 3 270M on a CPU: our engine beside transformers on the same GGUF, and what the hybrid KV cache holds.

    python benchmarks/gemma3_cpu.py [--threads 2] [--contexts 2048,8192] [--batches 1,8] [--dtypes fp32,bf16]
                                    [--long 32768] [--json out.json] [--force]

Sections (each a row of the table, each number measured in this run):

1. **prefill**: one prompt of ``context`` tokens, wall time -> tokens/s; ours (one step, monolithic) and
   transformers' ``Gemma3ForCausalLM`` forward (``use_cache=True``, as ``generate`` prefills).
2. **decode**: ``B`` sequences at ``context`` tokens each, the median of 8 decode steps -> ms per step
   (all B tokens); ours: the engine's decode steps on the hybrid pool; transformers: a forward of ``B``
   new tokens over its ``DynamicCache`` (prefilled once, not timed).
3. **long prefill**: one ``--long``-token prompt through our engine in 2,048-token chunks: wall time and the
   process's peak RSS (``ru_maxrss``); and, from the pool itself, blocks a sliding group vs a global group
   holds at the end (the sliding layer's KV as a fraction of the global layer's).
4. **memory at 8K, bf16**: peak RSS of a fresh process that loads the model in bf16 and prefills 8K tokens.

The targets it reports against (issue "Gemma 3 in the engine"): ours >= 1.0x transformers' throughput; a
32K prompt in <= 5 minutes with peak <= 3 GiB; a sliding layer's KV at 32K <= 1/40 of a global layer's; 8K
in bf16 <= 1.5 GiB. It refuses to record on a loaded machine (``longctx.provenance.load_gate``) unless
``--force`` (then the record says so). Not a test: the numbers are the machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def peak_rss_gib() -> float:
    """This process's peak resident set (``VmHWM``; ``ru_maxrss`` would carry a parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def _in_a_fresh_process(code: str) -> dict:
    """Run ``code`` (which prints one JSON line last) in a new interpreter: its peak memory is its own."""
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'benchmarks'); " + code],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def long_prefill(tokens: int, threads: int) -> dict:
    """One ``tokens``-token prompt through our engine in 2,048-token chunks: the prefill's wall time, the
    peak RSS, and the blocks each KV-cache group holds after it."""
    import torch

    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    torch.set_num_threads(threads)
    model = load_model(dtype=torch.float32, model="gemma3-270m")
    seconds, pool, seq = _ours_prefill_s(model, _prompt(load_tokenizer("gemma3-270m"), tokens), 2048)
    return {"tokens": tokens, "prefill_s": seconds, "peak_rss_gib": peak_rss_gib(),
            "blocks_after_prefill": pool.blocks_held(seq.seq_id)}


def _prompt(tok, n: int) -> list[int]:
    from longctx.evals.haystack import HaystackBuilder

    return HaystackBuilder(tok).build(n, 0.5, seed=0).token_ids


def _ours_prefill_s(model, ids, chunk=None) -> tuple[float, object, object]:
    from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, TorchExecutor
    from longctx.kv.hybrid import block_manager_for, pool_blocks_for_tokens

    pool = block_manager_for(model.config, pool_blocks_for_tokens(model.config, len(ids) + 16))
    sched = MonolithicScheduler() if chunk is None else ChunkedPrefillScheduler(chunk)
    engine = Engine(TorchExecutor(model, pool), sched, max_model_len=model.config.max_context)
    seq = engine.add_request(ids, 2)
    t0 = time.perf_counter()
    while not seq.output_token_ids:
        engine.step()
    return time.perf_counter() - t0, pool, seq


def _ours_decode_ms(model, ids, batch: int) -> float:
    from longctx.engine import ChunkedPrefillScheduler, Engine, TorchExecutor
    from longctx.kv.hybrid import block_manager_for, pool_blocks_for_tokens

    pool = block_manager_for(model.config, batch * pool_blocks_for_tokens(model.config, len(ids) + 16))
    engine = Engine(TorchExecutor(model, pool), ChunkedPrefillScheduler(2048),
                    max_model_len=model.config.max_context)
    seqs = [engine.add_request(ids, 12) for _ in range(batch)]
    while not all(s.output_token_ids for s in seqs):
        engine.step()
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _hf(dtype):
    import warnings

    import torch
    from transformers import Gemma3ForCausalLM

    from longctx.model.registry import resolve_model

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    path = resolve_model("gemma3-270m").locate()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Gemma3ForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.to(dtype).eval()


def _hf_prefill_and_decode(hf, ids, batch: int) -> tuple[float, float]:
    import torch

    x = torch.tensor([ids] * batch)
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = hf(x, use_cache=True)
        prefill_s = time.perf_counter() - t0
        cache, nxt = out.cache, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(8):
            t0 = time.perf_counter()
            out = hf(nxt, cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            cache, nxt = out.cache, out.logits[:, -1:].argmax(-1)
    return prefill_s, 1000 * statistics.median(times)


def _memory_8k_bf16() -> float:
    """Peak RSS (GiB) of a fresh process: load in bf16, prefill 8K tokens in 2K chunks."""
    return _in_a_fresh_process(
        "import json, gemma3_cpu as g; from longctx.model.weights import load_model; "
        "from longctx.model.tokenizer import load_tokenizer; "
        "m = load_model(dtype='bf16', model='gemma3-270m'); t = load_tokenizer('gemma3-270m'); "
        "g._ours_prefill_s(m, g._prompt(t, 8192), 2048); print(json.dumps(g.peak_rss_gib()))")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--long", type=int, default=32768, help="the long prompt's tokens (0: skip)")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers (ours only)")
    parser.add_argument("--json", default=None, help="write the record here")
    parser.add_argument("--force", action="store_true", help="record on a loaded machine (marked unusable)")
    args = parser.parse_args(argv)
    import torch

    from longctx import provenance
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    load = provenance.load_gate(args.threads, args.force)
    torch.set_num_threads(args.threads)
    tok = load_tokenizer("gemma3-270m")
    contexts = [int(x) for x in args.contexts.split(",") if x]
    batches = [int(x) for x in args.batches.split(",") if x]
    rows = []
    for dtype_name in [d for d in args.dtypes.split(",") if d]:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        ours = load_model(dtype=dtype, model="gemma3-270m")
        hf = None if args.no_hf else _hf(dtype)
        for n in contexts:
            ids = _prompt(tok, n)
            ours_prefill, _, _ = _ours_prefill_s(ours, ids)
            for b in batches:
                row = {"dtype": dtype_name, "context": n, "batch": b,
                       "ours_prefill_tok_s": n / ours_prefill if b == 1 else None,
                       "ours_decode_ms": _ours_decode_ms(ours, ids, b)}
                if hf is not None:
                    hf_prefill, hf_decode = _hf_prefill_and_decode(hf, ids, b)
                    row.update(hf_prefill_tok_s=n / hf_prefill if b == 1 else None, hf_decode_ms=hf_decode)
                rows.append(row)
                print(json.dumps(row), flush=True)
        del ours, hf
    record = {"rows": rows, "provenance": {
        "commit": provenance.git_commit(), "dirty": provenance.git_dirty(), "machine": provenance.machine(),
        "load_before": load, "threads": args.threads, "forced": args.force,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    if args.long:  # in a fresh process: its peak is its own, not transformers' of the sections above
        record["long"] = _in_a_fresh_process(
            f"import json, gemma3_cpu as g; print(json.dumps(g.long_prefill({args.long}, {args.threads})))")
        print(json.dumps(record["long"]), flush=True)
    record["memory_8k_bf16_gib"] = _memory_8k_bf16()
    print(json.dumps({"memory_8k_bf16_gib": record["memory_8k_bf16_gib"]}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
