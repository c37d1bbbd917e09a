"""Figures for the lessons' GPU cells. Each draws on ``ax`` (or a new figure), returns the Axes, and names
its source in the title; the source is chosen before drawing (``choose_source``), in this order:

1. ``record=`` (a record dict or a path): "recorded: <device>, <date>".
2. the shipped record of ``gpu`` (``longctx/data/gpu/<gpu>.json``) when it exists: "recorded: ...".
3. otherwise the roofline on ``gpu``'s datasheet: "prediction (no GPU record yet)".

They never measure, on a GPU or not: measuring is ``make gpu-bench``, which writes the record they read.
Nothing is caught: a broken record raises with its reason.
"""

from __future__ import annotations

from longctx.flops import chunk_flops, step_cost
from longctx.gpu.records import check_record, describe, load_record, record_path
from longctx.model.config import LLAMA3_8B, resized
from longctx.sim import CostFactors, CostModelExecutor
from longctx.specs import get_hardware

PREDICTION = "prediction (no GPU record yet)"


def choose_source(gpu: str = "h200", record=None) -> tuple[dict | None, str]:
    """``(record or None, title line)``: ``record`` (a dict or a path), else ``gpu``'s shipped record, else
    None and the prediction's label."""
    if record is not None:
        rec = check_record(record) if isinstance(record, dict) else load_record(path=record)
    elif record_path(gpu).is_file():
        rec = load_record(gpu)
    else:
        return None, f"{PREDICTION}: {gpu.upper()} datasheet roofline"
    return rec, f"recorded: {describe(rec)}"


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 3.5))
    return ax


def _finish(ax, title: str, label: str, **axes_set):
    ax.set(**axes_set)
    ax.set_xscale("log", base=2)
    ax.set_title(f"{title}\n{label}", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def _rows(rec: dict, section: str) -> list[dict]:
    return [r for r in rec.get(section, []) if r["model"] == "llama-3-8b"]


def _roofline_s(gpu: str, sequences) -> float:
    """A step's roofline time: the whole-batch cost model with efficiency 1 and no overhead."""
    return CostModelExecutor(LLAMA3_8B, gpu, CostFactors.ideal(), form="batch").step_time_s(sequences)


def predicted_prefill_curve(gpu="h200", prompt_tokens=8192, chunk_sizes=(128, 256, 512, 1024, 2048, 4096, 8192)):
    """Roofline FLOP/s of prefilling ``prompt_tokens`` at Llama-3-8B shape in chunks: chunk -> FLOP/s."""
    pieces = {c: [(min(c, prompt_tokens - s), s) for s in range(0, prompt_tokens, c)] for c in chunk_sizes}
    return {c: sum(step_cost(LLAMA3_8B, [p]).flops for p in ps) / sum(_roofline_s(gpu, [p]) for p in ps)
            for c, ps in pieces.items()}


def predicted_decode_bandwidth(gpu="h200", batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), contexts=(1024, 4096, 32768)):
    """Roofline bytes/s of one Llama-3-8B decode step: context -> batch -> bytes / time (what fits)."""
    out = {L: {b: step_cost(LLAMA3_8B, [(1, L)] * b).bytes for b in batch_sizes} for L in contexts}
    return {L: {b: n / _roofline_s(gpu, [(1, L)] * b) for b, n in row.items() if n <= get_hardware(gpu).memory_bytes}
            for L, row in out.items()}


def show_prefill_chunk_curve(ax=None, gpu: str = "h200", record=None):
    """Achieved TFLOP/s against prefill chunk size at Llama-3-8B shape (earlier chunks' KV attended)."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        rows = _rows(rec, "prefill_chunks")
        ax.plot([r["chunk_size"] for r in rows], [r["flops_per_s"] / 1e12 for r in rows], "o-", label="measured")
        ax.axhline(rec["ceilings"]["matmul"]["flops_per_s"] / 1e12, color="grey", ls="--", label="matmul ceiling")
    else:
        pred = predicted_prefill_curve(gpu)
        ax.plot(list(pred), [v / 1e12 for v in pred.values()], "o--", label="roofline")
        ax.axhline(get_hardware(gpu).peak_flops_per_s / 1e12, color="grey", ls="--", label="datasheet peak")
    return _finish(ax, "Llama-3-8B prefill throughput against chunk size", label, xlabel="chunk size (tokens)",
                   ylabel="achieved TFLOP/s", ylim=(0, None))


def show_decode_bandwidth(ax=None, gpu: str = "h200", record=None):
    """Achieved bandwidth (TB/s) of one Llama-3-8B decode step against batch size, one line per context."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        curves: dict[int, dict[int, float]] = {}
        for r in _rows(rec, "decode"):
            curves.setdefault(r["context_tokens"], {})[r["batch_size"]] = r["bytes_per_s"]
        ceiling, ceiling_label = rec["ceilings"]["copy"]["bytes_per_s"], "copy ceiling"
    else:
        curves = predicted_decode_bandwidth(gpu)
        ceiling, ceiling_label = get_hardware(gpu).memory_bandwidth_bytes_per_s, "datasheet bandwidth"
    for L, pts in sorted(curves.items()):
        ax.plot(list(pts), [v / 1e12 for v in pts.values()], "o-" if rec else "o--", label=f"context {L:,}")
    ax.axhline(ceiling / 1e12, color="grey", ls="--", label=ceiling_label)
    return _finish(ax, "Llama-3-8B decode step bandwidth", label, xlabel="decode batch size (sequences)",
                   ylabel="achieved TB/s (weights + KV)", ylim=(0, None))


def show_attention_share(ax=None, gpu: str = "h200", record=None):
    """Attention's share of one Llama-3-8B layer's prefill time as the context grows (the compute wall),
    beside its share of the FLOPs (causal, ``params="matmul"``)."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        rows = _rows(rec, "attention_share")
        xs, flop_share = [r["context_tokens"] for r in rows], [r["flop_share"] for r in rows]
        ax.plot(xs, [100 * r["attention_share"] for r in rows], "o-", label="measured share of time")
    else:
        xs = [2**k for k in range(10, 18)]
        flop_share = [chunk_flops(resized(LLAMA3_8B, num_layers=1), T, logit_tokens=0).attention_share for T in xs]
    ax.plot(xs, [100 * f for f in flop_share], "s--", color="grey", label="share of FLOPs (causal)")
    ax.axhline(50, color="tab:red", ls=":", lw=1)
    return _finish(ax, "Attention against the rest of a Llama-3-8B layer", label,
                   xlabel="context (tokens, one prefill)", ylabel="attention share (%)", ylim=(0, 100))
