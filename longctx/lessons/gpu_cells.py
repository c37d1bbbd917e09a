"""Figures for the lessons' GPU cells. Each draws on ``ax`` (or a new figure), returns the Axes, and names
its source in the title; the source is chosen before drawing (``choose_source``), in this order:

1. ``record=`` (a record dict or a path): "recorded: <device> (<date>, commit <c>, backend <b>, n = 1)".
2. the shipped record of ``gpu`` (``longctx/data/gpu/<gpu>.json``) when it exists: "recorded: ...".
3. otherwise the roofline on ``gpu``'s datasheet: "prediction (no GPU record yet)".

They never measure, on a GPU or not: measuring is ``make gpu-bench``, which writes the record they read.
Nothing is caught: a broken record raises with its reason. A record's label names the device, the date and
the commit measured; each curve names its attention backend.

The course's central experiments as tables, each row with its provenance (``"recorded: NVIDIA H200
(2026-12-04, commit a1e9a4f, backend reference, n = 1)"``): ``recorded_stall`` / ``show_stall_table`` and
``recorded_capstone`` / ``show_capstone_table`` read both the serving runs shipped beside a record
(``<gpu>_stall.json``, ``<gpu>_capstone.json``) and the record's own ``stall`` / ``capstone`` sections.
"""

from __future__ import annotations

from longctx.flops import chunk_flops, step_cost
from longctx.gpu.records import (
    check_record,
    load_record,
    load_serving,
    record_path,
    row_backend,
    stall_cell,
)
from longctx.model.config import LLAMA3_8B, resized
from longctx.recorded import recorded_path
from longctx.sim import CostFactors, CostModelExecutor
from longctx.specs import get_hardware

PREDICTION = "prediction (no GPU record yet)"


def choose_source(gpu: str = "h200", record=None) -> tuple[dict | None, str]:
    """``(record or None, title line)``: ``record`` (a dict or a path), else ``gpu``'s shipped record, else
    None and the prediction's label. A record's line is ``record_line``'s."""
    if record is not None:
        rec = check_record(record) if isinstance(record, dict) else load_record(path=record)
    elif record_path(gpu).is_file():
        rec = load_record(gpu)
    else:
        return None, f"{PREDICTION}: {gpu.upper()} datasheet roofline"
    return rec, record_line(rec)


def record_line(rec: dict) -> str:
    """``"recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)"``: a kernel record's
    provenance, naming every backend its prefill and decode rows ran with (one run of the suite: n = 1)."""
    ran = dict.fromkeys(row_backend(rec, r) for s in ("prefill_chunks", "decode") for r in rec.get(s, []))
    device = rec["device"]["name"] + (", toy run" if rec["toy"] else "")
    return serving_label(device, rec["date"], rec["device"].get("commit"), " and ".join(ran) or "none", 1)


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


def _rows(rec: dict, section: str) -> dict[str, list[dict]]:
    """The Llama-3-8B rows of ``section`` by attention backend."""
    out: dict[str, list[dict]] = {}
    for r in rec.get(section, []):
        if r["model"] == "llama-3-8b":
            out.setdefault(row_backend(rec, r), []).append(r)
    return out


def _roofline_s(gpu: str, sequences) -> float:
    """A step's roofline time: the whole-batch cost model with efficiency 1 and no overhead."""
    return CostModelExecutor(LLAMA3_8B, gpu, CostFactors.ideal(), form="batch").step_time_s(sequences)


def predicted_prefill_curve(gpu="h200", prompt_tokens=8192,
                            chunk_sizes=(128, 256, 512, 1024, 2048, 4096, 8192)):
    """Roofline FLOP/s of prefilling ``prompt_tokens`` at Llama-3-8B shape in chunks: chunk -> FLOP/s."""
    pieces = {c: [(min(c, prompt_tokens - s), s) for s in range(0, prompt_tokens, c)] for c in chunk_sizes}
    return {c: sum(step_cost(LLAMA3_8B, [p]).flops for p in ps) / sum(_roofline_s(gpu, [p]) for p in ps)
            for c, ps in pieces.items()}


def predicted_decode_bandwidth(gpu="h200", batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                               contexts=(1024, 4096, 32768)):
    """Roofline bytes/s of one Llama-3-8B decode step: context -> batch -> bytes / time (what fits)."""
    out = {L: {b: step_cost(LLAMA3_8B, [(1, L)] * b).bytes for b in batch_sizes} for L in contexts}
    return {L: {b: n / _roofline_s(gpu, [(1, L)] * b) for b, n in row.items()
                if n <= get_hardware(gpu).memory_bytes}
            for L, row in out.items()}


def show_prefill_chunk_curve(ax=None, gpu: str = "h200", record=None):
    """Achieved TFLOP/s against prefill chunk size at Llama-3-8B shape (earlier chunks' KV attended)."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        for backend, rows in _rows(rec, "prefill_chunks").items():
            ax.plot([r["chunk_size"] for r in rows], [r["flops_per_s"] / 1e12 for r in rows], "o-",
                    label=f"measured ({backend} backend)")
        ax.axhline(rec["ceilings"]["matmul"]["flops_per_s"] / 1e12, color="grey", ls="--",
                   label="matmul ceiling")
    else:
        pred = predicted_prefill_curve(gpu)
        ax.plot(list(pred), [v / 1e12 for v in pred.values()], "o--", label="roofline")
        ax.axhline(get_hardware(gpu).peak_flops_per_s / 1e12, color="grey", ls="--", label="datasheet peak")
    return _finish(ax, "Llama-3-8B prefill throughput against chunk size", label,
                   xlabel="chunk size (tokens)", ylabel="achieved TFLOP/s", ylim=(0, None))


def show_decode_bandwidth(ax=None, gpu: str = "h200", record=None):
    """Achieved bandwidth (TB/s) of one Llama-3-8B decode step against batch size, one line per context."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        curves: dict[str, dict[int, float]] = {}
        for backend, rows in _rows(rec, "decode").items():
            for r in rows:
                curves.setdefault(f"context {r['context_tokens']:,} ({backend})", {})[r["batch_size"]] = (
                    r["bytes_per_s"]
                )
        ceiling, ceiling_label = rec["ceilings"]["copy"]["bytes_per_s"], "copy ceiling"
    else:
        curves = {f"context {L:,}": pts for L, pts in predicted_decode_bandwidth(gpu).items()}
        ceiling, ceiling_label = get_hardware(gpu).memory_bandwidth_bytes_per_s, "datasheet bandwidth"
    for name, pts in curves.items():
        ax.plot(list(pts), [v / 1e12 for v in pts.values()], "o-" if rec else "o--", label=name)
    ax.axhline(ceiling / 1e12, color="grey", ls="--", label=ceiling_label)
    return _finish(ax, "Llama-3-8B decode step bandwidth", label, xlabel="decode batch size (sequences)",
                   ylabel="achieved TB/s (weights + KV)", ylim=(0, None))


def show_attention_share(ax=None, gpu: str = "h200", record=None):
    """Attention's share of one Llama-3-8B layer's prefill time as the context grows (the compute wall),
    beside its share of the FLOPs (causal, ``params="matmul"``)."""
    ax, (rec, label) = _axes(ax), choose_source(gpu, record)
    if rec is not None:
        rows = [r for rs in _rows(rec, "attention_share").values() for r in rs]
        xs, flop_share = [r["context_tokens"] for r in rows], [r["flop_share"] for r in rows]
        ax.plot(xs, [100 * r["attention_share"] for r in rows], "o-", label="measured share of time")
    else:
        xs = [2**k for k in range(10, 18)]
        flop_share = [chunk_flops(resized(LLAMA3_8B, num_layers=1), T, logit_tokens=0).attention_share
                      for T in xs]
    ax.plot(xs, [100 * f for f in flop_share], "s--", color="grey", label="share of FLOPs (causal)")
    ax.axhline(50, color="tab:red", ls=":", lw=1)
    return _finish(ax, "Attention against the rest of a Llama-3-8B layer", label,
                   xlabel="context (tokens, one prefill)", ylabel="attention share (%)", ylim=(0, 100))


# -- the course's central experiments, recorded: stall and capstone tables ----------------------------------
def serving_label(device: str, date: str, commit: str | None, backend: str, n: int) -> str:
    """``"recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)"``."""
    return (f"recorded: {device} ({str(date)[:10]}, commit {commit[:7] if commit else 'not recorded'}, "
            f"backend {backend}, n = {n})")


def recorded_label(gpu: str = "h200", record=None) -> str | None:
    """``record_line`` of ``gpu``'s shipped record (``record=``: that one); None when nothing is recorded (the
    figures then show the datasheet prediction)."""
    rec, line = choose_source(gpu, record)
    return None if rec is None else line


def _serving_rows(part: str, gpu: str, record) -> list[tuple[dict, dict]]:
    """``(row, where)`` of every recorded ``part`` row: the serving run shipped beside ``gpu``'s record, then
    the record's own section (``record=``, else ``gpu``'s shipped record); ``where``: device, date, commit."""
    out = []
    if recorded_path(f"{gpu}_{part}.json", "gpu").is_file():
        data = load_serving(part, gpu)
        out += [(r, data["provenance"]) for r in data["rows"]]
    rec = choose_source(gpu, record)[0]
    if rec is not None:
        where = {"device": rec["device"]["name"] + (", toy run" if rec["toy"] else ""), "date": rec["date"],
                 "commit": rec["device"].get("commit")}
        out += [(r, where) for r in rec.get(part, [])]
    return out


def recorded_stall(gpu: str = "h200", record=None, backend: str | None = None) -> list[dict]:
    """Every recorded stall cell of ``gpu`` (``backend``: only that one's): the long prompt, the scheduler
    (``monolithic`` / ``chunked-<budget>``), ``n`` runs, the long prompt's TTFT and the decoders' worst gap
    (medians over the runs, with min and max), their P99 and median gap, each against monolithic at the same
    prompt and source, and ``source``, the provenance line. Empty when nothing is recorded."""
    cells = []
    for row, where in _serving_rows("stall", gpu, record):
        if backend is not None and row["attention_backend"] != backend:
            continue
        s = stall_cell(row)
        cells.append({"source": serving_label(where["device"], where["date"], where["commit"],
                                              row["attention_backend"], row["n"]),
                      "attention_backend": row["attention_backend"], "long_prompt": row["long_prompt"],
                      "scheduler": ("monolithic" if row["token_budget"] is None
                                    else f"chunked-{row['token_budget']}"),
                      "n": row["n"], "ttft_s": s["ttft_s"]["median"], "ttft_min_s": s["ttft_s"]["min"],
                      "ttft_max_s": s["ttft_s"]["max"], "worst_gap_s": s["worst_gap_s"]["median"],
                      "worst_gap_min_s": s["worst_gap_s"]["min"], "worst_gap_max_s": s["worst_gap_s"]["max"],
                      "p99_gap_s": s["p99_gap_s"]["median"], "median_gap_s": s["median_gap_s"]["median"]})
    mono = {(c["source"], c["long_prompt"]): c for c in cells if c["scheduler"] == "monolithic"}
    for c in cells:
        m = mono.get((c["source"], c["long_prompt"]))
        c["ttft_x_monolithic"] = c["ttft_s"] / m["ttft_s"] if m else None
        c["worst_gap_x_monolithic"] = c["worst_gap_s"] / m["worst_gap_s"] if m else None
    return cells


def show_stall_table(gpu: str = "h200", record=None, backend: str | None = None) -> str:
    """Print (and return) ``recorded_stall`` as a table under each source's provenance line."""
    cells = recorded_stall(gpu, record, backend)
    if not cells:
        text = f"no recorded stall run for {gpu.upper()} yet (make gpu-bench on that GPU records one)"
    else:
        lines, source = [], None
        for c in cells:
            if c["source"] != source:
                source = c["source"]
                lines += [source, f"{'prompt':>7} {'scheduler':<14} {'n':>2} {'TTFT s':>8} {'x mono':>7} "
                                  f"{'worst gap ms':>13} {'x mono':>7} {'P99 ms':>8} {'median ms':>9}"
                                  "  worst gap min-max ms"]
            spread_s = (f"  {c['worst_gap_min_s'] * 1e3:.0f}-{c['worst_gap_max_s'] * 1e3:.0f}"
                        if c["n"] > 1 else "  -")
            lines.append(f"{c['long_prompt']:>7,} {c['scheduler']:<14} {c['n']:>2} {c['ttft_s']:>8.2f} "
                         f"{c['ttft_x_monolithic'] or float('nan'):>6.1f}x {c['worst_gap_s'] * 1e3:>13.0f} "
                         f"{c['worst_gap_x_monolithic'] or float('nan'):>6.2f}x {c['p99_gap_s'] * 1e3:>8.0f} "
                         f"{c['median_gap_s'] * 1e3:>9.1f}{spread_s}")
        text = "\n".join(lines)
    print(text)
    return text


def recorded_capstone(gpu: str = "h200", record=None, backend: str | None = None) -> list[dict]:
    """Every recorded capstone run of ``gpu``: users x prompt, KV dtype, pool blocks, peak GPU memory, the
    peak number decoding at once (``all_resident``: True when every user decoded in one step, None when not
    recorded), TTFT and ITL (None where not recorded), wall time, ``source`` (provenance line)."""
    out = []
    for row, where in _serving_rows("capstone", gpu, record):
        if backend is not None and row["attention_backend"] != backend:
            continue
        peak = row["peak_resident"]
        out.append({"source": serving_label(where["device"], where["date"], where["commit"],
                                            row["attention_backend"], row["n"]),
                    **{k: row.get(k) for k in ("attention_backend", "kv_dtype", "users", "prompt",
                                               "out_tokens", "pool_blocks", "gpu_mem_peak_gib",
                                               "peak_resident", "ttft_median_s", "ttft_max_s",
                                               "itl_median_s", "itl_p99_s", "wall_s", "n")},
                    "all_resident": None if peak is None else peak == row["users"]})
    return out


def show_capstone_table(gpu: str = "h200", record=None, backend: str | None = None) -> str:
    """Print (and return) ``recorded_capstone`` as a table under each source's provenance line."""
    rows = recorded_capstone(gpu, record, backend)
    if not rows:
        text = f"no recorded capstone run for {gpu.upper()} yet (make gpu-bench on that GPU records one)"
    else:
        lines, source = [], None
        for r in rows:
            if r["source"] != source:
                source = r["source"]
                lines += [source, f"{'KV':<5} {'users':>5} {'blocks':>7} {'peak GiB':>8} {'resident':>9} "
                                  f"{'TTFT med s':>10} {'TTFT max s':>10} {'ITL med ms':>10} {'wall s':>7}"]
            res = "n/r" if r["peak_resident"] is None else f"{r['peak_resident']}/{r['users']}"
            mem = "n/r" if r["gpu_mem_peak_gib"] is None else f"{r['gpu_mem_peak_gib']:.1f}"
            itl = "n/r" if r["itl_median_s"] is None else f"{r['itl_median_s'] * 1e3:.1f}"
            lines.append(f"{r['kv_dtype']:<5} {r['users']:>5} {r['pool_blocks']:>7,} {mem:>8} {res:>9} "
                         f"{r['ttft_median_s']:>10.2f} {r['ttft_max_s']:>10.2f} {itl:>10} "
                         f"{r['wall_s']:>7.1f}")
        text = "\n".join(lines + ["(n/r: not recorded by that run)"])
    print(text)
    return text
