"""A GPU record: one JSON object per run of ``make gpu-bench``, in ``longctx/data/gpu/<device key>.json``.

    schema, date (ISO 8601), toy, dtype, device {name, key, torch, cuda, driver, ...}, config, wall_s,
    skipped [str], errors [str], models {name: {config (a ModelSpec as a dict), num_params}},
    ceilings {matmul {flops_per_s, median_s, n}, copy {bytes_per_s (read + written), median_s, bytes}},
    prefill_chunks [{model, chunk_size, prompt_tokens, time_s, flops, flops_per_s, chunks [[new, cached, s]]}],
    decode [{model, batch_size, context_tokens, step_s, bytes, bytes_per_s, flops}],
    attention_share [{model, context_tokens, attention_s, rest_s, attention_share, flop_share}],
    exercise1 {model, scenario {...}, runs {scheduler: [Exercise1Result.to_dict(), ...]}}

Times in seconds, rates per second, bytes in bytes. ``check_record`` checks what readers rely on.
"""

from __future__ import annotations

import datetime
import json
import pathlib

from longctx.recorded import load_recorded, recorded_path

SCHEMA = "longctx.gpu/2"
REQUIRED = ("schema", "date", "toy", "dtype", "device", "ceilings", "models")


def check_record(record: dict) -> dict:
    """``record`` when it has the keys readers rely on, the right schema and a date; else ``ValueError``."""
    if not isinstance(record, dict):
        raise ValueError(f"a GPU record is a JSON object, got {type(record).__name__}")
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ValueError(f"the GPU record lacks {', '.join(missing)}")
    if record["schema"] != SCHEMA:
        raise ValueError(f"GPU record schema {record['schema']!r}; this code reads {SCHEMA!r}")
    datetime.datetime.fromisoformat(str(record["date"]))  # ValueError when it is not ISO 8601
    if not {"name", "key"} <= set(record["device"]):
        raise ValueError("record.device needs a name and a key")
    for part, rate in (("matmul", "flops_per_s"), ("copy", "bytes_per_s")):
        if not record["ceilings"].get(part, {}).get(rate, 0) > 0:
            raise ValueError(f"record.ceilings.{part}.{rate} must be a positive number")
    return record


def record_path(device: str = "h200") -> pathlib.Path:
    """Where the record of ``device`` (its key: ``"h200"``) is shipped, existing or not."""
    return recorded_path(f"{device}.json", "gpu")


def load_record(device: str = "h200", path: str | pathlib.Path | None = None) -> dict:
    """The checked record of ``device`` (or the file at ``path``); ``ValueError`` when it is absent or broken
    (ask ``record_path(device).is_file()`` first)."""
    return check_record(load_recorded(f"{device}.json", "gpu", path))


def save_record(record: dict, path: str | pathlib.Path) -> pathlib.Path:
    """Write ``record`` as indented JSON (checked first); returns the path."""
    check_record(record)
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p


def describe(record: dict) -> str:
    """``"NVIDIA H200, 2026-11-20"`` (plus ``", toy run"``): where a figure's numbers come from."""
    return f"{record['device']['name']}, {str(record['date'])[:10]}" + (", toy run" if record["toy"] else "")
