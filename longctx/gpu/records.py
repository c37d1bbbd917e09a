"""A GPU record: one JSON object per run of ``make gpu-bench``, in ``longctx/data/gpu/<device key>.json``.

``record_schema.GpuRecord`` (pydantic) is its schema, what the readers rely on (lessons' GPU figures, the
calibration benchmark, the summary); seconds, per second, bytes. Keys it does not name are kept as written.
Its serving sections (``stall``, ``capstone``) have the same rows as the one-off serving runs shipped beside
it (``<device>_stall.json``, ``<device>_capstone.json``, read by ``load_serving``).
"""

from __future__ import annotations

import json
import pathlib

from longctx.provenance import device_key  # noqa: F401 (re-exported: the record's file name)
from longctx.recorded import load_recorded, recorded_path

SCHEMA = "longctx.gpu/2"


SERVING = ("stall", "capstone")  # the one-off serving runs shipped beside a record: <device>_<part>.json


def check_record(record: dict) -> dict:
    """``record`` when ``GpuRecord`` accepts it; else ``ValueError`` naming each field at fault. Without
    pydantic (the lent GPU machines) only the schema's name is checked: the CPU tests check the rest."""
    if record.get("schema") != SCHEMA:
        raise ValueError(f"not a valid GPU record ({SCHEMA}): schema: Input should be {SCHEMA!r}, "
                         f"got {record.get('schema')!r}")
    return _check("GpuRecord", record, f"a valid GPU record ({SCHEMA})")


def _check(schema_name: str, data: dict, what: str) -> dict:
    try:
        from pydantic import ValidationError

        from longctx.gpu import record_schema
    except ImportError:  # no pydantic on this machine: written as measured, validated where it is read
        return data
    try:
        getattr(record_schema, schema_name).model_validate(data)
    except ValidationError as exc:
        errs = [_where(e["loc"]) + f": {e['msg']}" + (f", got {e['input']!r}" if isinstance(
            e["input"], str | int | float) else "") for e in exc.errors()]
        more = f"; and {len(errs) - 5} more" if len(errs) > 5 else ""
        raise ValueError(f"not {what}: " + "; ".join(errs[:5]) + more) from None
    return data


def _where(loc: tuple) -> str:
    """``("decode", 0, "step_s")`` -> ``"decode[0].step_s"``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "the record"


def record_path(device: str = "h200") -> pathlib.Path:
    """Where the record of ``device`` (its key) is shipped, existing or not."""
    return recorded_path(f"{device}.json", "gpu")


def load_record(device: str = "h200", path: str | pathlib.Path | None = None) -> dict:
    """The checked record of ``device`` (or the file at ``path``); ``ValueError`` when absent or broken."""
    return check_record(load_recorded(f"{device}.json", "gpu", path))


def load_serving(part: str, device: str = "h200", path: str | pathlib.Path | None = None) -> dict:
    """A one-off serving run shipped beside ``device``'s record: ``part`` ``"stall"`` or ``"capstone"``
    (``longctx/data/gpu/<device>_<part>.json``, or the file at ``path``), checked: ``{"what", "provenance",
    "setup", "rows"}``, rows as the record's ``stall`` / ``capstone`` sections. ``ValueError`` when absent or
    broken."""
    if part not in SERVING:
        raise ValueError(f"unknown serving part {part!r}; allowed: {', '.join(SERVING)}")
    return _check(f"{part.capitalize()}Data", load_recorded(f"{device}_{part}.json", "gpu", path),
                  f"a valid {part} file")


def save_record(record: dict, path: str | pathlib.Path) -> pathlib.Path:
    """Write ``record`` as indented JSON, checked first; returns the path."""
    text = json.dumps(check_record(record), indent=1) + "\n"
    (p := pathlib.Path(path)).parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def describe(record: dict) -> str:
    """``"NVIDIA H200, 2026-11-20"`` (plus ``", toy run"``): where a figure's numbers come from."""
    return f"{record['device']['name']}, {str(record['date'])[:10]}" + (", toy run" if record["toy"] else "")


def provenance(record: dict) -> str:
    """``"NVIDIA H200, 2026-12-04, commit a1e9a4f"``: ``describe`` plus the code that measured."""
    commit = record["device"].get("commit")
    return describe(record) + (f", commit {commit[:7]}" if commit else ", commit not recorded")


GRAPH_SUFFIX = {"on": "+graphs", "eager-buffers": "+buffers"}  # a decode row's ``cuda_graphs`` -> its label


def row_backend(record: dict, row: dict) -> str:
    """The attention backend a row ran with: its own, else the record's (older records name one), else
    ``"reference"`` (records made before the backend seam ran today's reference code); ``"fused+graphs"``
    for a decode row replayed from CUDA graphs (``"fused+buffers"``: the toy run's graph buffers, eager)."""
    name = row.get("attention_backend") or record.get("attention_backend") or "reference"
    graphs = row.get("cuda_graphs")
    return name + (GRAPH_SUFFIX.get(graphs, "") if isinstance(graphs, str) else "")


def spread(values) -> dict:
    """``{"median", "min", "max", "n"}`` of a list of numbers (the runs of one cell)."""
    v = sorted(values)
    if not v:
        raise ValueError("spread of an empty list")
    mid = len(v) // 2
    return {"median": v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2, "min": v[0], "max": v[-1],
            "n": len(v)}


def stall_cell(row: dict) -> dict:
    """One stall cell summarized over its runs: ``spread`` of the long prompt's TTFT, the worst, P99 and
    median decoder gap."""
    keys = {"ttft_s": "long_ttft_s", "worst_gap_s": "itl_max_s", "p99_gap_s": "itl_p99_s",
            "median_gap_s": "itl_median_s"}
    return {k: spread([run[v] for run in row["runs"]]) for k, v in keys.items()}
