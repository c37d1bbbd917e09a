"""The GPU suite behind ``python -m longctx gpu-bench``: one prepared run, a time cap, one JSON record.

Sections, in order (each gets a share of what is left of the cap; a point that would start after its
section's deadline is skipped and listed under ``skipped``):

1. ``ceilings``: a large matmul's FLOP/s and a device-to-device copy's bytes/s (read + written).
2. ``prefill_chunks``: one prompt prefilled in chunks of 128 ... 8192 tokens at Llama-3-8B shape; every
   chunk attends to the KV cache of the earlier ones. Time per chunk and achieved FLOP/s.
3. ``decode``: one decode step against batch size (1 ... 256) and context (1K ... 32K), with achieved
   bandwidth against the measured copy ceiling (batch x context capped so the KV cache fits).
4. ``attention_share``: one layer at prefill, attention core versus the rest, as the context grows.
5. ``exercise1``: 16 decoding streams plus one 12K-token prompt on the real engine, monolithic versus
   chunked prefill (budgets 512, 1024, 2048): TTFT and ITL distributions.
6. The same 2-4 at a Llama-3.1-70B-shaped slice (a few of its layers).

``BenchConfig.toy()`` runs every section on the CPU in seconds with tiny fp32 models (tests use it).
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from longctx.gpu import device_key, device_name
from longctx.gpu.records import SCHEMA

SECTIONS = ("ceilings", "prefill_chunks", "decode", "attention_share", "exercise1", "slice")
SECTION_WEIGHTS = {"ceilings": 0.5, "prefill_chunks": 1.5, "decode": 2.0, "attention_share": 1.0,
                   "exercise1": 2.5, "slice": 1.5}


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. ``full()``: the real H200 run (bf16); ``toy()``: the same code at toy sizes."""

    is_toy: bool = False
    dtype: str = "bfloat16"
    warmup: int = 2
    repeats: int = 5
    matmul_n: int = 8192
    copy_bytes: int = 2 * 2**30  # 2 GiB read + 2 GiB written: far beyond the 60 MB L2
    prefill_prompt_tokens: int = 8192
    chunk_sizes: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    max_decode_kv_tokens: int = 1 << 19  # 512K tokens = 64 GiB of Llama-3-8B bf16 KV
    attention_contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    ex1_num_decode_streams: int = 16
    ex1_prompt_tokens: int = 12_000
    ex1_stream_context_tokens: int = 1024
    ex1_budgets: tuple[int, ...] = (512, 1024, 2048)
    ex1_repeats: int = 3
    ex1_warmup_steps: int = 20
    ex1_tail_steps: int = 10
    slice_layers: int = 4
    main_layers: int | None = None  # None: all 32 layers of Llama-3-8B
    slice_decode_batch_sizes: tuple[int, ...] = (1, 16, 64, 256)
    slice_decode_contexts: tuple[int, ...] = (4096, 32768)
    slice_attention_contexts: tuple[int, ...] = (4096, 16384, 65536)
    block_size: int = 16
    max_scores_per_call: int = 1 << 28
    time_cap_s: float = 360.0
    sections: tuple[str, ...] = SECTIONS

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; allowed: {', '.join(SECTIONS)}")
        if self.time_cap_s <= 0:
            raise ValueError(f"time_cap_s must be > 0 seconds, got {self.time_cap_s}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")

    @classmethod
    def full(cls, **overrides) -> BenchConfig:
        return cls(**overrides)

    @classmethod
    def toy(cls, **overrides) -> BenchConfig:
        sizes = dict(is_toy=True, dtype="float32", warmup=1, repeats=3, matmul_n=256, copy_bytes=8 * 2**20,
                     prefill_prompt_tokens=256, chunk_sizes=(16, 32, 64, 128, 256),
                     decode_batch_sizes=(1, 2, 4, 8), decode_contexts=(64, 128, 256),
                     max_decode_kv_tokens=1024, attention_contexts=(64, 128, 256, 512),
                     ex1_num_decode_streams=4, ex1_prompt_tokens=384, ex1_stream_context_tokens=64,
                     ex1_budgets=(64, 128), ex1_repeats=1, ex1_warmup_steps=4, ex1_tail_steps=3,
                     slice_layers=1, slice_decode_batch_sizes=(1, 4), slice_decode_contexts=(64, 128),
                     slice_attention_contexts=(64, 256), max_scores_per_call=1 << 24, time_cap_s=60.0)
        sizes.update(overrides)
        return cls(**sizes)


@dataclass
class Budget:
    """Deadlines: each section gets its weight's share of the time left when it starts."""

    cap_s: float
    start: float = field(default_factory=time.monotonic)
    skipped: list[str] = field(default_factory=list)
    section_deadline: float = 0.0

    def begin(self, section: str, remaining: list[str]) -> None:
        left = self.cap_s - (time.monotonic() - self.start)
        total = sum(SECTION_WEIGHTS[s] for s in remaining) or 1.0
        self.section_deadline = time.monotonic() + max(0.0, left) * SECTION_WEIGHTS[section] / total

    def allows(self, what: str) -> bool:
        """True while the section has time left; otherwise records ``what`` as skipped."""
        if time.monotonic() < self.section_deadline:
            return True
        self.skipped.append(f"{what} (time cap)")
        return False


def device_info(device) -> dict:
    """Name, key, driver, torch and CUDA versions, memory and multiprocessors of ``device``."""
    import torch

    info = {"name": device_name() if str(device).startswith("cuda") else "cpu", "torch": torch.__version__,
            "cuda": torch.version.cuda, "driver": None, "python": platform.python_version()}
    if str(device).startswith("cuda"):
        p = torch.cuda.get_device_properties(device)
        info.update(memory_bytes=int(p.total_memory), multiprocessors=int(p.multi_processor_count),
                    capability=f"{p.major}.{p.minor}", driver=_driver_version())
    else:
        info.update(processor=platform.processor() or platform.machine())
    info["key"] = device_key(info["name"])
    return info


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def run_suite(config: BenchConfig, device=None, name: str | None = None,
              log: Callable[[str], None] | None = None) -> dict:
    """Run every section of ``config`` on ``device`` (default: CUDA if present, else the CPU); returns the
    record (see ``longctx.gpu.records``). ``name`` overrides the device name (and its key)."""
    import torch

    from longctx.gpu import sections

    log = log or (lambda _msg: None)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    dtype = getattr(torch, config.dtype)
    info = device_info(device)
    if name:
        info.update(name=name, key=device_key(name))
    budget = Budget(config.time_cap_s)
    record: dict = {
        "schema": SCHEMA, "device": info,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "toy": config.is_toy, "dtype": config.dtype, "config": _jsonable(asdict(config)),
        "notes": ("random-weight models built with longctx.model.llama; attention is torch SDPA over K/V "
                  "gathered from the paged cache (longctx.model.llama), not a fused paged-attention "
                  "kernel, so decode bandwidth and prefill FLOP/s are this engine's, not vLLM's"),
    }
    ctx = sections.Context(record, config, device, dtype, budget, log)
    todo = [s for s in SECTIONS if s in config.sections]
    threads = torch.get_num_threads()
    if device.type == "cpu":  # tiny CPU kernels: one thread avoids OpenMP barriers stalling on a busy machine
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for i, section in enumerate(todo):
                budget.begin(section, todo[i:])
                t0 = time.monotonic()
                log(f"[{section}] ...")
                ctx.guarded(f"section {section}", lambda section=section: getattr(sections, section)(ctx))
                log(f"[{section}] done in {time.monotonic() - t0:.1f} s")
    finally:
        ctx.drop_models()
        torch.set_num_threads(threads)
    record["skipped"] = budget.skipped
    record.setdefault("errors", [])
    record["wall_s"] = round(time.monotonic() - budget.start, 3)
    return record


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def summary_lines(record: dict) -> list[str]:
    """A few lines a person reads after the run: ceilings, best/worst of each curve, Exercise 1."""
    from longctx.gpu.records import describe

    c = record["ceilings"]
    lines = [f"{describe(record)}: torch {record['device']['torch']}, CUDA {record['device']['cuda']}, "
             f"driver {record['device']['driver']}, {record['wall_s']:.0f} s",
             f"ceilings: matmul {c['matmul']['flops_per_s'] / 1e12:.1f} TFLOP/s (n={c['matmul']['n']}), "
             f"copy {c['copy']['bytes_per_s'] / 1e12:.2f} TB/s (read + written)"]
    for row in record.get("prefill_chunks", []):
        lines.append(f"prefill {row['model']} chunk {row['chunk_size']:>5}: {row['time_s'] * 1e3:9.2f} ms for "
                     f"{row['prompt_tokens']} tokens, {row['flops_per_s'] / 1e12:7.2f} TFLOP/s")
    dec = record.get("decode", [])
    if dec:
        best = max(dec, key=lambda r: r["bytes_per_s"])
        lines.append(f"decode: {len(dec)} points; best {best['bytes_per_s'] / 1e12:.2f} TB/s at batch "
                     f"{best['batch_size']} context {best['context_tokens']} ({best['model']})")
    for row in record.get("attention_share", []):
        lines.append(f"layer {row['model']} T={row['context_tokens']:>6}: attention {row['attention_share']:5.1%} "
                     f"of time ({row['flop_share']:5.1%} of FLOPs)")
    for name, run in record.get("exercise1", {}).get("runs", {}).items():
        lines.append(f"exercise1 {name:<13}: TTFT {run['ttft_median_s'] * 1e3:9.1f} ms, ITL p50 "
                     f"{run['itl_p50_s'] * 1e3:7.2f} ms, p99 {run['itl_p99_s'] * 1e3:8.2f} ms, max "
                     f"{run['max_itl_s'] * 1e3:8.2f} ms")
    if record.get("errors"):
        lines.append(f"ERRORS {len(record['errors'])}: " + "; ".join(record["errors"][:4]))
    if record.get("skipped"):
        lines.append(f"skipped {len(record['skipped'])}: " + "; ".join(record["skipped"][:6])
                     + (" ..." if len(record["skipped"]) > 6 else ""))
    return lines
