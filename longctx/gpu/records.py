"""Recorded GPU results: the schema of ``longctx/data/gpu/<device>.json``, its loader, and estimates for
another GPU by roofline ratios.

A record (schema ``longctx.gpu/1``) is one JSON object::

    schema, date (ISO 8601), toy (bool), dtype, device {name, key, torch, cuda, driver, ...}, config,
    wall_s, skipped [str], models {name: {config, num_params}},
    ceilings {matmul {flops_per_s, median_s, ...}, copy {bytes_per_s (read + written), median_s, ...}},
    prefill_chunks [{model, chunk_size, prompt_tokens, time_s, flops, flops_per_s, chunks [[new, cached, s]]}],
    decode [{model, batch_size, context_tokens, step_s, bytes, bytes_per_s, fraction_of_copy?}],
    attention_share [{model, context_tokens, attention_s, rest_s, attention_share, flop_share}],
    exercise1 {model, num_decode_streams, prompt_tokens, runs {scheduler: {ttft_s [..], itl_s [..], steps}}}

Times in seconds, rates per second, bytes in bytes. ``validate_record`` checks all of it and says what is
wrong. ``estimate_for(record, "h100")`` rescales each measured time by the roofline: a step whose ideal
time on the source GPU is set by its bytes scales with the bandwidth ratio, one set by its FLOPs with the
peak ratio (an H200 and an H100 SXM share 989 TFLOP/s; 4.8 versus 3.35 TB/s), and marks it estimated.
"""

from __future__ import annotations

import bisect
import copy
import datetime
import json
import math
import pathlib
from importlib import resources

SCHEMA = "longctx.gpu/1"
SECTION_KEYS = {
    "prefill_chunks": ("model", "chunk_size", "prompt_tokens", "time_s", "flops", "flops_per_s", "chunks"),
    "decode": ("model", "batch_size", "context_tokens", "step_s", "bytes", "bytes_per_s"),
    "attention_share": ("model", "context_tokens", "attention_s", "rest_s", "attention_share", "flop_share"),
}
POSITIVE = {"chunk_size", "prompt_tokens", "time_s", "flops", "flops_per_s", "batch_size", "context_tokens",
            "step_s", "bytes", "bytes_per_s", "attention_s", "rest_s"}


def _positive(where: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where} must be a positive finite number, got {value!r}")


def _need(d: dict, where: str, keys) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")


def validate_record(record: dict) -> dict:
    """Check ``record`` against the schema; returns it. Raises ``ValueError`` saying what is wrong."""
    _need(record, "record", ("schema", "date", "toy", "device", "ceilings"))
    if record["schema"] != SCHEMA:
        raise ValueError(f"record.schema must be {SCHEMA!r}, got {record['schema']!r}")
    try:
        datetime.datetime.fromisoformat(str(record["date"]))
    except ValueError:
        raise ValueError(f"record.date must be ISO 8601 (2026-11-20T10:00:00+00:00), got {record['date']!r}") from None
    if not isinstance(record["toy"], bool):
        raise ValueError(f"record.toy must be true or false, got {record['toy']!r}")
    _need(record["device"], "record.device", ("name", "key", "torch", "cuda", "driver"))
    for k in ("name", "key", "torch"):
        if not isinstance(record["device"][k], str) or not record["device"][k]:
            raise ValueError(f"record.device.{k} must be a non-empty string, got {record['device'][k]!r}")
    _need(record["ceilings"], "record.ceilings", ("matmul", "copy"))
    _need(record["ceilings"]["matmul"], "record.ceilings.matmul", ("flops_per_s", "median_s"))
    _need(record["ceilings"]["copy"], "record.ceilings.copy", ("bytes_per_s", "median_s"))
    for part, key in (("matmul", "flops_per_s"), ("copy", "bytes_per_s")):
        for k in (key, "median_s"):
            _positive(f"record.ceilings.{part}.{k}", record["ceilings"][part][k])
    models = record.get("models", {})
    for section, keys in SECTION_KEYS.items():
        rows = record.get(section, [])
        if not isinstance(rows, list):
            raise ValueError(f"record.{section} must be a list, got {type(rows).__name__}")
        for i, row in enumerate(rows):
            where = f"record.{section}[{i}]"
            _need(row, where, keys)
            for k in keys:
                if k in POSITIVE:
                    _positive(f"{where}.{k}", row[k])
            if row["model"] not in models:
                raise ValueError(f"{where}.model {row['model']!r} is not described under record.models")
            if section == "attention_share" and not 0 < row["attention_share"] < 1:
                raise ValueError(f"{where}.attention_share must be in (0, 1), got {row['attention_share']!r}")
            if section == "prefill_chunks":
                for j, chunk in enumerate(row["chunks"]):
                    if not (isinstance(chunk, list) and len(chunk) == 3):
                        raise ValueError(f"{where}.chunks[{j}] must be [new_tokens, cached_tokens, seconds]")
                    _positive(f"{where}.chunks[{j}] seconds", chunk[2])
    if "exercise1" in record:
        ex = record["exercise1"]
        _need(ex, "record.exercise1", ("model", "num_decode_streams", "prompt_tokens", "runs"))
        for name, run in ex["runs"].items():
            where = f"record.exercise1.runs[{name!r}]"
            _need(run, where, ("ttft_s", "itl_s", "steps"))
            for k in ("ttft_s", "itl_s"):
                if not run[k]:
                    raise ValueError(f"{where}.{k} is empty")
                for v in run[k]:
                    _positive(f"{where}.{k} values", v)
    return record


def records_dir() -> pathlib.Path:
    """``longctx/data/gpu`` (where ``make gpu-bench`` writes by default)."""
    return pathlib.Path(str(resources.files("longctx"))) / "data" / "gpu"


def load_recorded(device: str = "h200", path: str | pathlib.Path | None = None) -> dict | None:
    """The validated record of ``device`` (its key: ``"h200"``) from ``longctx/data/gpu``, or from ``path``;
    None when there is no such file. A file that breaks the schema raises ``ValueError``."""
    p = pathlib.Path(path) if path is not None else records_dir() / f"{device}.json"
    if not p.is_file():
        return None
    try:
        record = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p} is not valid JSON: {exc}") from None
    return validate_record(record)


def save_record(record: dict, path: str | pathlib.Path) -> pathlib.Path:
    """Validate and write ``record`` as indented JSON; returns the path."""
    validate_record(record)
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p


def describe(record: dict) -> str:
    """``"NVIDIA H200, 2026-11-20"``, or ``"H100 estimated by roofline ratios from the NVIDIA H200 record of
    2026-11-20"``, plus ``", toy run"`` for a toy record: for figure titles."""
    if record.get("estimated"):
        src = record["estimated_from"]
        out = (f"{record['device']['name']} estimated by roofline ratios from the {src['device']} record of "
               f"{str(src['date'])[:10]}")
    else:
        out = f"{record['device']['name']}, {str(record['date'])[:10]}"
    if record.get("toy"):
        out += ", toy run"
    return out


# ---- estimates for another GPU --------------------------------------------------------------------------


def estimate_for(record: dict, target_hw="h100", source_hw=None) -> dict:
    """A copy of ``record`` with every time rescaled to ``target_hw`` by the roofline ratios, marked
    ``estimated: True``. ``source_hw`` defaults to the registry's spec for ``record.device.key``."""
    from longctx.gpu.estimate import scale_record
    from longctx.specs import get_hardware

    src = get_hardware(source_hw if source_hw is not None else record["device"]["key"])
    dst = get_hardware(target_hw)
    out = scale_record(copy.deepcopy(record), src, dst)
    out["estimated"] = True
    out["estimated_from"] = {"device": record["device"]["name"], "date": record["date"], "source_hw": src.name,
                             "method": "roofline: memory-bound times x source/target bandwidth, compute-bound "
                                       "times x source/target peak FLOP/s"}
    out["device"] = {**record["device"], "name": dst.name.upper(), "key": dst.name,
                     "memory_bytes": dst.memory_bytes}
    return out


def remap_times(times, step_ends, deltas_cum) -> list[float]:
    """Shift each time by the cumulative change of the step durations that ended at or before it."""
    out = []
    for t in times:
        i = bisect.bisect_right(step_ends, t + 1e-12)
        out.append(t + (deltas_cum[i - 1] if i else 0.0))
    return out
