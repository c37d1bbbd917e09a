"""A GPU record: one JSON object per run of ``make gpu-bench``, in ``longctx/data/gpu/<device key>.json``.

``GpuRecord`` (pydantic) is its schema, what the readers rely on (lessons' GPU figures, the calibration
benchmark, the summary); seconds, per second, bytes. Keys it does not name are kept as written. Its serving
sections (``stall``, ``capstone``) have the same rows as the one-off serving runs shipped beside it
(``<device>_stall.json``, ``<device>_capstone.json``, read by ``load_serving``).
"""

from __future__ import annotations

import datetime
import json
import pathlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, ValidationError

from longctx.provenance import device_key  # noqa: F401 (re-exported: the record's file name)
from longctx.recorded import load_recorded, recorded_path

SCHEMA = "longctx.gpu/2"


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class Device(_Part):
    name: str  # "NVIDIA H200", or "cpu" for a toy run
    key: str  # device_key(name): the record's file name
    memory_bytes: int | None = None


class Matmul(_Part):
    flops_per_s: PositiveFloat


class Copy(_Part):
    bytes_per_s: PositiveFloat  # bytes read + bytes written


class Ceilings(_Part):
    matmul: Matmul
    copy_: Copy = Field(alias="copy")


class PrefillRow(_Part):  # one prompt prefilled in chunks of chunk_size, each after the earlier ones
    model: str
    attention_backend: str | None = None  # the backend that ran; None: the record's (older records: one)
    chunk_size: int
    prompt_tokens: int
    time_s: PositiveFloat
    flops_per_s: PositiveFloat
    chunks: list[tuple[int, int, NonNegativeFloat]]  # (new tokens, cached tokens, seconds)


class DecodeRow(_Part):  # one decode step of batch_size sequences at context_tokens each
    model: str
    attention_backend: str | None = None
    batch_size: int
    context_tokens: int
    step_s: PositiveFloat
    bytes_per_s: PositiveFloat


class AttentionRow(_Part):  # one layer's prefill of context_tokens: attention against the rest
    model: str
    context_tokens: int
    attention_share: float = Field(ge=0, le=1)
    flop_share: float = Field(ge=0, le=1)


class StallRun(_Part):  # one run of D decoders + one long prompt arriving while they decode
    long_ttft_s: PositiveFloat  # the long prompt's arrival to its first token
    itl_median_s: NonNegativeFloat  # over every decoder's inter-token gaps after the arrival
    itl_p99_s: NonNegativeFloat
    itl_max_s: NonNegativeFloat  # the worst stall a decoder saw
    decoder_gaps_after_arrival: int = Field(ge=1)


class StallRow(_Part):  # one cell: a long prompt under one scheduler, n runs after a warm-up
    long_prompt: int = Field(ge=1)
    scheduler: Literal["monolithic", "chunked"]
    token_budget: int | None  # chunked: the step's token budget; monolithic: None
    attention_backend: str
    n: int = Field(ge=1)
    runs: list[StallRun] = Field(min_length=1)


class CapstoneRow(_Part):  # users x prompt tokens arriving at once, one KV dtype
    users: int = Field(ge=1)
    prompt: int = Field(ge=1)
    out_tokens: int = Field(ge=1)
    kv_dtype: str  # "bf16", "fp8", ...
    attention_backend: str
    n: int = Field(ge=1)
    pool_blocks: int = Field(ge=1)
    peak_resident: int | None  # most sequences decoding in one step (None: not recorded)
    gpu_mem_peak_gib: NonNegativeFloat | None
    ttft_median_s: PositiveFloat
    ttft_max_s: PositiveFloat
    wall_s: PositiveFloat


class GpuRecord(_Part):
    schema_: Literal[SCHEMA] = Field(alias="schema")
    date: datetime.datetime
    toy: bool
    dtype: str
    device: Device
    ceilings: Ceilings
    models: dict[str, dict]  # name -> {config: a ModelSpec as a dict, num_params}
    prefill_chunks: list[PrefillRow] = []
    decode: list[DecodeRow] = []
    attention_share: list[AttentionRow] = []
    stall: list[StallRow] = []
    capstone: list[CapstoneRow] = []
    attention_backend: str | None = None  # older records: the one backend every row ran with
    complete: bool | None = None  # False in the copy written after each section (a run killed keeps it)
    errors: list[str] = []
    skipped: list[str] = []


class Provenance(_Part):  # where a one-off serving run's numbers come from
    device: str
    date: str
    commit: str
    torch: str
    cuda: str | None
    attention_backend: str
    runs_per_cell: int = Field(ge=1)
    how: str


class _Serving(_Part):
    provenance: Provenance
    setup: dict


class StallData(_Serving):
    what: Literal["stall"]
    rows: list[StallRow] = Field(min_length=1)


class CapstoneData(_Serving):
    what: Literal["capstone"]
    rows: list[CapstoneRow] = Field(min_length=1)


SERVING = {"stall": StallData, "capstone": CapstoneData}


def check_record(record: dict) -> dict:
    """``record`` when ``GpuRecord`` accepts it; else ``ValueError`` naming each field at fault."""
    return _check(GpuRecord, record, f"a valid GPU record ({SCHEMA})")


def _check(schema: type[BaseModel], data: dict, what: str) -> dict:
    try:
        schema.model_validate(data)
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
    return _check(SERVING[part], load_recorded(f"{device}_{part}.json", "gpu", path), f"a valid {part} file")


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


def row_backend(record: dict, row: dict) -> str:
    """The attention backend a row ran with: its own, else the record's (older records name one), else
    ``"reference"`` (records made before the backend seam ran today's reference code)."""
    return row.get("attention_backend") or record.get("attention_backend") or "reference"


def spread(values) -> dict:
    """``{"median", "min", "max", "n"}`` of a list of numbers (the runs of one cell)."""
    v = sorted(values)
    if not v:
        raise ValueError("spread of an empty list")
    mid = len(v) // 2
    return {"median": v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2, "min": v[0], "max": v[-1], "n": len(v)}


def stall_cell(row: dict) -> dict:
    """One stall cell summarized over its runs: ``spread`` of the long prompt's TTFT, the worst, P99 and
    median decoder gap."""
    keys = {"ttft_s": "long_ttft_s", "worst_gap_s": "itl_max_s", "p99_gap_s": "itl_p99_s",
            "median_gap_s": "itl_median_s"}
    return {k: spread([run[v] for run in row["runs"]]) for k, v in keys.items()}
