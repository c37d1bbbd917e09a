"""Rescale a record's measured times to another GPU by roofline ratios (``records.estimate_for``).

For each measured step: its ideal compute time ``FLOPs / peak`` and memory time ``bytes / bandwidth`` on
the source GPU say which bound it sits on; its time is multiplied by ``source peak / target peak`` when
compute-bound, by ``source bandwidth / target bandwidth`` when memory-bound. Pure Python (no torch).
"""

from __future__ import annotations

import itertools

import numpy as np

from longctx.gpu import counts
from longctx.model.config import resized, spec_from_dict
from longctx.specs import HardwareSpec, ModelSpec

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class _Scaler:
    def __init__(self, src: HardwareSpec, dst: HardwareSpec):
        self.src, self.dst = src, dst
        self.compute = src.peak_flops_per_s / dst.peak_flops_per_s
        self.memory = src.memory_bandwidth_bytes_per_s / dst.memory_bandwidth_bytes_per_s

    def ratio(self, flops: float, nbytes: float) -> float:
        """Time ratio target/source of work with ``flops`` and ``nbytes``, by its bound on the source."""
        compute_bound = flops / self.src.peak_flops_per_s >= nbytes / self.src.memory_bandwidth_bytes_per_s
        return self.compute if compute_bound else self.memory


def scale_record(record: dict, src: HardwareSpec, dst: HardwareSpec) -> dict:
    """Rescale ``record`` (a copy: it is modified in place) from ``src`` to ``dst``; returns it."""
    s = _Scaler(src, dst)
    db = DTYPE_BYTES.get(record.get("dtype", "bfloat16"), 2)
    cfgs = {k: spec_from_dict(v["config"]) for k, v in record.get("models", {}).items()}
    mm, cp = record["ceilings"]["matmul"], record["ceilings"]["copy"]
    for d, r, key in ((mm, s.compute, "flops_per_s"), (cp, s.memory, "bytes_per_s")):
        for k in ("median_s", "min_s", "max_s"):
            if k in d:
                d[k] *= r
        d[key] /= r
    for row in record.get("prefill_chunks", []):
        cfg = cfgs[row["model"]]
        old = sum(t for _, _, t in row["chunks"])
        row["chunks"] = [[n, c, t * s.ratio(counts.executed_flops(cfg, [(n, c)], 1)["flops"],
                                            counts.min_step_bytes(cfg, [(n, c)], db))]
                         for n, c, t in row["chunks"]]
        row["time_s"] *= sum(t for _, _, t in row["chunks"]) / old
        row["flops_per_s"] = row["flops"] / row["time_s"]
    fits = [r for r in record.get("decode", []) if r["bytes"] <= 0.9 * dst.memory_bytes]
    record.setdefault("skipped", []).extend(
        f"{r['model']} decode batch {r['batch_size']} context {r['context_tokens']} (weights + KV do not fit "
        f"{dst.name}'s {dst.memory_bytes / 1e9:.0f} GB)" for r in record.get("decode", []) if r not in fits)
    if "decode" in record:
        record["decode"] = fits
    for row in record.get("decode", []):
        seqs = [(1, row["context_tokens"])] * row["batch_size"]
        r = s.ratio(counts.executed_flops(cfgs[row["model"]], seqs, row["batch_size"])["flops"], row["bytes"])
        row["step_s"] *= r
        row.pop("min_s", None)
        row["bytes_per_s"] = row["bytes"] / row["step_s"]
        if "fraction_of_copy" in row:
            row["fraction_of_copy"] = row["bytes_per_s"] / cp["bytes_per_s"]
    for row in record.get("attention_share", []):
        cfg, T = cfgs[row["model"]], row["context_tokens"]
        one = resized(cfg, num_layers=1)
        f = counts.executed_flops(one, [(T, 0)], 0)
        row["attention_s"] *= s.ratio(f["attention_flops"], counts.attention_core_bytes(one, T, db))
        row["rest_s"] *= s.ratio(f["linear_flops"], counts.rest_of_layer_bytes(one, T, db))
        row["attention_share"] = row["attention_s"] / (row["attention_s"] + row["rest_s"])
        for k, fk, tk in (("attention_flops_per_s", "attention_flops", "attention_s"),
                          ("rest_flops_per_s", "linear_flops", "rest_s")):
            if k in row:
                row[k] = f[fk] / row[tk]
    if "exercise1" in record:
        ex = record["exercise1"]
        cfg = cfgs[ex["model"]]
        steady = [(1, ex.get("stream_context_tokens", 1024))] * ex["num_decode_streams"]
        r_steady = s.ratio(counts.executed_flops(cfg, steady, len(steady))["flops"],
                           counts.min_step_bytes(cfg, steady, db))
        for run in ex["runs"].values():
            _scale_exercise1_run(run, cfg, s, db)
            if "steady_itl_s" in run:
                run["steady_itl_s"] *= r_steady
    return record


def _scale_exercise1_run(run: dict, cfg: ModelSpec, s: _Scaler, db: int) -> None:
    """Rescale each step of the recorded run, shift every later token by the change, recompute TTFT/ITL."""
    from longctx.gpu.records import remap_times

    ends, deltas = [], []
    for st in run["steps"]:
        seqs = [tuple(p) for p in st["sequences"]]
        r = s.ratio(counts.executed_flops(cfg, seqs, len(seqs))["flops"], counts.min_step_bytes(cfg, seqs, db))
        ends.append(st["end_s"])
        deltas.append(st["duration_s"] * (r - 1))
        st["duration_s"] *= r
    cum = list(itertools.accumulate(deltas))
    for st in run["steps"]:
        st["start_s"], st["end_s"] = remap_times([st["start_s"], st["end_s"]], ends, cum)
        st["start_s"] = min(st["start_s"], st["end_s"])
    run["stream_token_times_s"] = [remap_times(t, ends, cum) for t in run["stream_token_times_s"]]
    arrival = run["arrival_s"]
    first_token = remap_times([arrival + run["ttft_s"][-1]], ends, cum)[0]
    run["ttft_s"] = [first_token - arrival]
    run["itl_s"] = [float(g) for t in run["stream_token_times_s"] for g in np.diff(t)]
    run["ttft_median_s"] = run["ttft_s"][0]
    run["itl_p50_s"] = float(np.percentile(run["itl_s"], 50))
    run["itl_p99_s"] = float(np.percentile(run["itl_s"], 99))
    run["max_itl_s"] = max(run["itl_s"])
    run["estimated_from_runs"] = 1
