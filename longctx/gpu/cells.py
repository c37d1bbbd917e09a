"""Figures for the lessons' GPU cells. Each draws on ``ax`` (or a new figure) and returns the Axes:

- ``show_prefill_chunk_curve``: achieved TFLOP/s of a Llama-3-8B prefill against chunk size (lesson 02).
- ``show_decode_bandwidth``: achieved TB/s of a decode step against batch size, per context (lesson 01).
- ``show_attention_share``: attention's share of a layer's prefill time as the context grows (lesson 04).
- ``show_exercise1_itl``: Exercise 1's inter-token gaps, monolithic versus chunked prefill (lesson 02).

Where the numbers come from, in order: ``record=`` (a dict or a path) when given; measured live when CUDA is present (small sizes: a few of the
model's layers, seconds), else the recorded file ``longctx/data/gpu/<gpu>.json`` (the title names the
device and date; ``gpu="h100"`` rescales the H200 record by roofline ratios and says "estimated"), else
the roofline prediction from the datasheet, titled "prediction (no GPU record yet)". They never raise and
never write to stderr: a failure falls back to the next source, and the last resort writes the reason
inside the axes.
"""

from __future__ import annotations

import contextlib
import io
import warnings

from longctx.gpu import counts
from longctx.model.config import resized

PREDICTION = "prediction (no GPU record yet)"
LIVE_SECTIONS = {
    "prefill": dict(sections=("ceilings", "prefill_chunks"), prefill_prompt_tokens=4096,
                    chunk_sizes=(128, 256, 512, 1024, 2048, 4096)),
    "decode": dict(sections=("ceilings", "decode"), decode_batch_sizes=(1, 4, 16, 64),
                   decode_contexts=(1024, 4096), max_decode_kv_tokens=1 << 18),
    "attention": dict(sections=("ceilings", "attention_share"), attention_contexts=(1024, 4096, 16384, 32768)),
}
LIVE_COMMON = dict(main_layers=2, warmup=1, repeats=3, matmul_n=4096, copy_bytes=2**30, time_cap_s=45.0)


@contextlib.contextmanager
def _quiet():
    """No warnings and nothing on stderr (lesson cells stay clean on any machine)."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _axes(ax):
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 3.5))
    return ax


def _live(kind: str) -> tuple[dict | None, str]:
    from longctx import gpu

    if not gpu.available():
        return None, ""
    from longctx.gpu.bench import BenchConfig, run_suite

    rec = run_suite(BenchConfig.full(**LIVE_COMMON, **LIVE_SECTIONS[kind]))
    return rec, f"measured live on {rec['device']['name']} (2 of 32 layers, small sizes)"


def _recorded(gpu: str) -> tuple[dict | None, str]:
    from longctx.gpu.records import describe, estimate_for, load_recorded

    rec = load_recorded(gpu)
    if rec is None and gpu != "h200":
        base = load_recorded("h200")
        rec = None if base is None else estimate_for(base, gpu)
    if rec is None:
        return None, ""
    return rec, ("" if rec.get("estimated") else "recorded: ") + describe(rec)


def _source(kind: str, gpu: str, live: bool | None, record=None) -> tuple[dict | None, str]:
    """(record, label) from the first source that works: live, recorded, none (the caller predicts).
    ``record`` (a dict or a path) replaces the recorded file."""
    if record is not None:
        try:
            from longctx.gpu.records import describe, estimate_for, load_recorded, validate_record
            from longctx.specs import HARDWARE

            rec = validate_record(record) if isinstance(record, dict) else load_recorded(path=record)
            if rec is not None and rec["device"]["key"] != gpu and gpu in HARDWARE and not rec.get("estimated"):
                rec = estimate_for(rec, gpu)
            if rec is not None:
                return rec, ("" if rec.get("estimated") else "recorded: ") + describe(rec)
        except Exception:
            pass
    if live is not False:
        try:
            rec, label = _live(kind)
            if rec is not None:
                return rec, label
        except Exception:
            pass
    try:
        return _recorded(gpu)
    except Exception:
        return None, ""


def _fail(ax, what: str, exc: Exception):
    ax.text(0.5, 0.5, f"{what}: could not draw ({type(exc).__name__}: {exc})", ha="center", va="center",
            wrap=True, transform=ax.transAxes, fontsize=9)
    return ax


def _ctx_label(tokens: int) -> str:
    return f"context {tokens // 1024}K" if tokens >= 1024 else f"context {tokens}"


def _hw(gpu: str):
    from longctx.specs import HARDWARE, get_hardware

    return get_hardware(gpu if gpu in HARDWARE else "h200")


# ---- prefill against chunk size -------------------------------------------------------------------------


def predicted_prefill_curve(gpu: str = "h200", prompt_tokens: int = 8192,
                            chunk_sizes=(128, 256, 512, 1024, 2048, 4096, 8192)) -> dict[int, float]:
    """Roofline FLOP/s of prefilling ``prompt_tokens`` at Llama-3-8B shape in chunks (each chunk's time is
    max(FLOPs / peak, bytes / bandwidth), datasheet numbers): chunk -> FLOP/s."""
    from longctx.model.config import LLAMA3_8B

    hw, out = _hw(gpu), {}
    for c in chunk_sizes:
        pieces = [(min(c, prompt_tokens - s), s) for s in range(0, prompt_tokens, c)]
        t = sum(max(counts.executed_flops(LLAMA3_8B, [p], 1)["flops"] / hw.peak_flops_per_s,
                    counts.min_step_bytes(LLAMA3_8B, [p], 2) / hw.memory_bandwidth_bytes_per_s) for p in pieces)
        out[c] = counts.executed_flops(LLAMA3_8B, pieces, len(pieces))["flops"] / t
    return out


def show_prefill_chunk_curve(ax=None, gpu: str = "h200", live: bool | None = None, record=None):
    """Achieved TFLOP/s against prefill chunk size at Llama-3-8B shape (earlier chunks' KV attended)."""
    with _quiet():
        ax = _axes(ax)
        try:
            rec, label = _source("prefill", gpu, live, record)
            if rec and rec.get("prefill_chunks"):
                rows = [r for r in rec["prefill_chunks"] if r["model"] == "llama-3-8b"]
                ax.plot([r["chunk_size"] for r in rows], [r["flops_per_s"] / 1e12 for r in rows], "o-",
                        label="Llama-3-8B prefill")
                ax.axhline(rec["ceilings"]["matmul"]["flops_per_s"] / 1e12, color="grey", ls="--",
                           label="measured matmul ceiling")
            else:
                pred = predicted_prefill_curve(gpu)
                ax.plot(list(pred), [v / 1e12 for v in pred.values()], "o--", label="roofline")
                ax.axhline(_hw(gpu).peak_flops_per_s / 1e12, color="grey", ls="--", label="datasheet peak")
                label = f"{PREDICTION}: {_hw(gpu).name.upper()} datasheet roofline"
            ax.axvline(512, color="tab:red", ls=":", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("chunk size (tokens)")
            ax.set_ylabel("achieved TFLOP/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"Prefill throughput against chunk size\n{label}", fontsize=10)
            ax.legend(fontsize=8)
        except Exception as exc:
            return _fail(ax, "prefill chunk curve", exc)
    return ax


# ---- decode bandwidth ------------------------------------------------------------------------------------


def predicted_decode_bandwidth(gpu: str = "h200", batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                               contexts=(1024, 4096, 32768)) -> dict[int, dict[int, float]]:
    """Roofline bytes/s of one Llama-3-8B decode step: context -> batch -> bytes / max(compute, memory)."""
    from longctx.model.config import LLAMA3_8B

    hw, out = _hw(gpu), {}
    for L in contexts:
        out[L] = {}
        for b in batch_sizes:
            seqs = [(1, L)] * b
            nbytes = counts.min_step_bytes(LLAMA3_8B, seqs, 2)
            if nbytes > hw.memory_bytes:
                continue
            t = max(counts.executed_flops(LLAMA3_8B, seqs, b)["flops"] / hw.peak_flops_per_s,
                    nbytes / hw.memory_bandwidth_bytes_per_s)
            out[L][b] = nbytes / t
    return out


def show_decode_bandwidth(ax=None, gpu: str = "h200", live: bool | None = None, record=None):
    """Achieved bandwidth (TB/s) of one decode step against batch size, one line per context."""
    with _quiet():
        ax = _axes(ax)
        try:
            rec, label = _source("decode", gpu, live, record)
            if rec and rec.get("decode"):
                by_ctx: dict[int, list] = {}
                for r in rec["decode"]:
                    if r["model"] == "llama-3-8b":
                        by_ctx.setdefault(r["context_tokens"], []).append((r["batch_size"], r["bytes_per_s"]))
                for L, pts in sorted(by_ctx.items()):
                    ax.plot([b for b, _ in pts], [v / 1e12 for _, v in pts], "o-", label=_ctx_label(L))
                ax.axhline(rec["ceilings"]["copy"]["bytes_per_s"] / 1e12, color="grey", ls="--",
                           label="measured copy ceiling")
            else:
                for L, pts in predicted_decode_bandwidth(gpu).items():
                    ax.plot(list(pts), [v / 1e12 for v in pts.values()], "o--", label=_ctx_label(L))
                ax.axhline(_hw(gpu).memory_bandwidth_bytes_per_s / 1e12, color="grey", ls="--",
                           label="datasheet bandwidth")
                label = f"{PREDICTION}: {_hw(gpu).name.upper()} datasheet roofline"
            ax.set_xscale("log", base=2)
            ax.set_xlabel("decode batch size (sequences)")
            ax.set_ylabel("achieved TB/s (weights + KV)")
            ax.set_ylim(bottom=0)
            ax.set_title(f"Decode step bandwidth\n{label}", fontsize=10)
            ax.legend(fontsize=8)
        except Exception as exc:
            return _fail(ax, "decode bandwidth", exc)
    return ax


# ---- attention share of a layer ------------------------------------------------------------------------


def show_attention_share(ax=None, gpu: str = "h200", live: bool | None = None, record=None):
    """Attention's share of one Llama-3-8B layer's prefill time as the context grows (the compute wall),
    with its share of the FLOPs (causal convention) for comparison."""
    from longctx.model.config import LLAMA3_8B

    with _quiet():
        ax = _axes(ax)
        try:
            rec, label = _source("attention", gpu, live, record)
            one = resized(LLAMA3_8B, num_layers=1)
            if rec and rec.get("attention_share"):
                rows = [r for r in rec["attention_share"] if r["model"] == "llama-3-8b"]
                xs = [r["context_tokens"] for r in rows]
                ax.plot(xs, [100 * r["attention_share"] for r in rows], "o-", label="measured share of time")
                flop_share = [r["flop_share"] for r in rows]
            else:
                xs = [2**k for k in range(10, 18)]
                label = f"{PREDICTION}: share of FLOPs"
                flop_share = [f["attention_flops"] / f["flops"]
                              for f in (counts.executed_flops(one, [(T, 0)], 0) for T in xs)]
            ax.plot(xs, [100 * f for f in flop_share], "s--", color="grey", label="share of FLOPs (causal)")
            ax.axhline(50, color="tab:red", ls=":", lw=1)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 100)
            ax.set_xlabel("context (tokens, one prefill)")
            ax.set_ylabel("attention share (%)")
            ax.set_title(f"Attention versus the rest of a layer\n{label}", fontsize=10)
            ax.legend(fontsize=8)
        except Exception as exc:
            return _fail(ax, "attention share", exc)
    return ax


# ---- Exercise 1 --------------------------------------------------------------------------------------------


def show_exercise1_itl(ax=None, gpu: str = "h200", record=None):
    """Exercise 1 (16 streams + a 12K prompt): each scheduler's inter-token gaps, from the record (no live
    run: it needs the whole 8B model); else the simulator's prediction on the datasheet GPU."""
    with _quiet():
        ax = _axes(ax)
        try:
            rec, label = _source("prefill", gpu, False, record)
            if rec and rec.get("exercise1", {}).get("runs"):
                data = {k: (r["itl_s"], r["ttft_median_s"]) for k, r in rec["exercise1"]["runs"].items()}
            else:
                from longctx.sim.scenarios import exercise1_compare

                res = exercise1_compare(model="llama-3-8b", hardware=_hw(gpu).name)
                data = {k: ([g for s in r.stream_itl_s() for g in s], r.long_prompt_ttft_s) for k, r in res.items()}
                label = f"{PREDICTION}: simulator, {_hw(gpu).name.upper()} datasheet"
            names = list(data)
            ax.boxplot([[1e3 * g for g in data[k][0]] for k in names], whis=(0, 100))
            ax.set_xticks(range(1, len(names) + 1), [f"{k}\nTTFT {1e3 * data[k][1]:.0f} ms" for k in names],
                          fontsize=8)
            ax.set_yscale("log")
            from matplotlib.ticker import ScalarFormatter

            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(ScalarFormatter())
            ax.set_ylabel("inter-token gap (ms)")
            ax.set_title(f"Exercise 1: decode gaps while a 12K prompt is prefilled\n{label}", fontsize=10)
        except Exception as exc:
            return _fail(ax, "Exercise 1", exc)
    return ax
