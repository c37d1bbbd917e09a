"""The GPU record's schema (pydantic): what ``longctx.gpu.records.check_record`` validates.

Kept apart from ``records`` because the lent GPU machines have no pydantic: there ``make gpu-bench`` writes
its record checked for the schema's name only, and the CPU tests validate every shipped record with this
schema. Keys it does not name are kept as written.
"""

from __future__ import annotations

import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat


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
    cuda_graphs: Literal["on", "eager-buffers"] | None = None  # replayed from a CUDA graph (None: eager)
    batch_size: int
    context_tokens: int
    step_s: PositiveFloat
    bytes_per_s: PositiveFloat


class DecodeProfileRow(_Part):  # one decode step's host, GPU and wall time
    model: str
    attention_backend: str
    cuda_graphs: Literal["on", "eager-buffers", "off"]
    batch_size: int
    context_tokens: int
    host_s: PositiveFloat  # the call's own time: enqueueing the step
    gpu_s: PositiveFloat | None  # CUDA events, the launches queued ahead; None: no GPU (a toy run)
    wall_s: PositiveFloat  # to the end of the step's GPU work
    bound: Literal["launch", "GPU"] | None


class FlexDecodeRow(_Part):  # the FlexAttention decode kernel alone, one layer
    batch_size: int
    context_tokens: int
    time_s: PositiveFloat
    kv_bytes: int
    bytes_per_s: PositiveFloat


class EnginePrefillRow(_Part):  # one prompt through the engine, whole or chunked, over a scattered pool
    model: str
    attention_backend: str
    chunk_size: int
    prompt_tokens: int
    scattered: bool
    n: int = Field(ge=1)
    time_s: PositiveFloat  # median over n runs
    min_s: PositiveFloat
    max_s: PositiveFloat
    share_of_whole_rate: float | None  # the whole prompt's time / this time (1.0 for the whole prompt)


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
    schema_: str = Field(alias="schema")  # records.SCHEMA, checked by records.check_record
    date: datetime.datetime
    toy: bool
    dtype: str
    device: Device
    ceilings: Ceilings
    models: dict[str, dict]  # name -> {config: a ModelSpec as a dict, num_params}
    prefill_chunks: list[PrefillRow] = []
    decode: list[DecodeRow] = []
    attention_share: list[AttentionRow] = []
    decode_profile: list[DecodeProfileRow] = []
    flex_decode: list[FlexDecodeRow] = []
    prefill_engine: list[EnginePrefillRow] = []
    stall: list[StallRow] = []
    capstone: list[CapstoneRow] = []
    attention_backend: str | None = None  # older records: the one backend every row ran with
    complete: bool | None = None  # False in the copy written after each section (a run killed keeps it)
    quick: bool | None = None  # gpu-bench --quick (None: older records)
    preflight: dict | None = None  # free memory, kernel failures, what was shrunk (older records: None)
    fallbacks: list[str] = []  # one line per thing that could not run as asked, and what ran instead
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


