"""The GPU suite behind ``python -m longctx gpu-bench``: one prepared run, a time cap, one record.

First the preflight (``longctx.gpu.preflight``): bf16 or fp16, the fused kernels compiled once on the card
(the reference backend stands in for the fused rows when they fail), every section sized to the card's free
memory. Each decision that changes what runs is one line under ``fallbacks``; what was shrunk is listed too.

Sections (``longctx.gpu.sections``), in order: ``ceilings`` (always run), ``prefill_chunks`` and ``decode``
(each point with every backend of ``attention_backends``, and the fused backend replayed from decode CUDA
graphs), ``decode_profile`` (host vs GPU vs wall time of decode steps; the FlexAttention decode kernel
alone), ``attention_share``, then the course's central experiments through the engine
(``longctx.gpu.serving_sections``): ``prefill_engine``, ``stall`` and ``capstone`` (random-weight
Llama-3-8B). Each gets its weight's share of the time left; a point past its section's deadline or out of
memory is listed under ``skipped`` (an engine run past it is stopped mid-run), any other failure under
``errors``, and the run goes on. ``BenchConfig.toy()`` runs it all on the CPU in seconds (the tests use it);
``BenchConfig.quick()`` is a learner's own GPU in a few minutes.
"""

from __future__ import annotations

import datetime
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from longctx.flops import StepCost, step_cost
from longctx.gpu.records import SCHEMA
from longctx.model.config import LLAMA3_8B, resized, spec_to_dict
from longctx.provenance import device_provenance
from longctx.specs import ModelSpec

SECTION_WEIGHTS = {"ceilings": 0.5, "prefill_chunks": 1.5, "decode": 1.5, "decode_profile": 0.5,
                   "attention_share": 0.5, "prefill_engine": 1.0, "stall": 4.0, "capstone": 3.0}
TOY = ModelSpec("toy", 2, 64, 4, 2, 16, "tiny random-weight stand-in for the CPU toy run",
                intermediate_size=160, vocab_size=512, rope_theta=10000.0, max_context=1 << 16)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: ``median_s`` of ``repeats`` timed calls after warm-up."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    timer: str  # "cuda-events" or "perf_counter"


def time_fn(fn: Callable[[], object], device="cpu", warmup: int = 2, repeats: int = 5) -> Timing:
    """``warmup`` untimed calls of ``fn``, then the median of ``repeats`` timed ones (the median resists a
    slow repeat). On CUDA, CUDA events bracket each repeat (the device's time, read after one
    ``synchronize``); elsewhere ``time.perf_counter``."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    cuda = str(device).startswith("cuda")
    if cuda:
        import torch

        torch.cuda.synchronize(device)

    def mark():
        if not cuda:
            return time.perf_counter()
        (event := torch.cuda.Event(enable_timing=True)).record()
        return event

    marks = [(mark(), fn(), mark()) for _ in range(repeats)]
    if cuda:
        torch.cuda.synchronize(device)
    times = [a.elapsed_time(b) / 1e3 if cuda else b - a for a, _, b in marks]  # elapsed_time is in ms
    return Timing(statistics.median(times), min(times), max(times), repeats,
                  "cuda-events" if cuda else "perf_counter")


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. ``BenchConfig()``: the real run on an H100 80 GB or an H200 (bf16; the preflight
    shrinks what does not fit the card); ``toy()``: the same code, tiny, on a CPU; ``quick()``: a small
    card in a few minutes."""

    is_toy: bool = False
    is_quick: bool = False
    dtype: str = "bf16"  # a longctx.specs dtype name
    warmup: int = 2
    repeats: int = 5
    matmul_n: int = 8192
    copy_bytes: int = 2 * 2**30  # 2 GiB read + 2 GiB written: far beyond the L2 cache
    prefill_prompt_tokens: int = 8192
    chunk_sizes: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    decode_contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768)
    max_decode_kv_tokens: int = 1 << 19  # 512K tokens = 64 GiB of Llama-3-8B bf16 KV
    attention_contexts: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    block_size: int = 16
    attention_backends: tuple[str, ...] = ("reference", "fused")  # prefill_chunks and decode, side by side
    serving_backend: str = "auto"  # stall and capstone (auto: fused on CUDA with a pool in the model's dtype)
    stall_decoders: int = 32
    stall_decoder_prompt: int = 512
    stall_arrival_after: int = 16  # output tokens each decoder has when the long prompt arrives
    stall_long_prompts: tuple[int, ...] = (8192, 32768)
    stall_budgets: tuple[int, ...] = (512, 2048)  # chunked prefill's token budgets (beside monolithic)
    stall_repeats: int = 5  # runs per cell, after one warm-up run per scheduler
    stall_tail_steps: int = 4  # steps after the long prompt's first token still in the window
    capstone_users: int = 64
    capstone_prompt: int = 8192
    capstone_token_budget: int = 8256  # one 8K prompt chunk beside 64 decodes
    capstone_kv_dtypes: tuple[str, ...] = ("bf16", "fp8")  # the model's dtype: a plain pool
    capstone_users_by_kv: tuple[tuple[str, int], ...] = ()  # (kv dtype, users) where fewer fit (preflight)
    capstone_repeats: int = 5  # runs per KV dtype, in rounds (a time cap leaves each dtype fewer, never none)
    num_layers: int | None = None  # fewer than the model's when its weights do not fit (preflight)
    cuda_graphs: str = "auto"  # decode-only steps replayed from CUDA graphs (auto: on CUDA with fused)
    decode_profile_points: tuple[tuple[int, int], ...] = (  # (batch, context): all fit an H100 80 GB's KV cap
        (1, 4096), (32, 4096), (64, 4096), (32, 8192), (128, 2048))
    engine_prefill_chunks: tuple[int, ...] = (512, 2048)  # prefill through the engine, beside the whole
    time_cap_s: float = 400.0
    sections: tuple[str, ...] = tuple(SECTION_WEIGHTS)

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTION_WEIGHTS)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; allowed: {', '.join(SECTION_WEIGHTS)}")
        if not self.time_cap_s > 0:
            raise ValueError(f"time_cap_s must be > 0 seconds, got {self.time_cap_s}")
        from longctx.model.attention import BACKEND_NAMES

        for b in (*self.attention_backends, self.serving_backend):
            if b not in BACKEND_NAMES:
                raise ValueError(f"unknown attention backend {b!r}; allowed: {', '.join(BACKEND_NAMES)}")
        if (min(self.stall_repeats, self.stall_decoders, self.capstone_users, self.capstone_repeats) < 1
                or self.stall_arrival_after < 2):
            raise ValueError("stall_repeats, stall_decoders, capstone_users and capstone_repeats must be "
                             ">= 1, stall_arrival_after >= 2 (a decoder's steady gap needs two tokens)")
        from longctx.engine.cuda_graphs import CUDA_GRAPH_MODES

        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}; "
                             f"got {self.cuda_graphs!r}")

    @classmethod
    def toy(cls, **overrides) -> BenchConfig:
        sizes = dict(is_toy=True, dtype="fp32", warmup=1, repeats=3, matmul_n=256, copy_bytes=8 * 2**20,
                     prefill_prompt_tokens=256, chunk_sizes=(16, 32, 64, 128, 256),
                     decode_batch_sizes=(1, 2, 4, 8), decode_contexts=(64, 128, 256),
                     max_decode_kv_tokens=1024, attention_contexts=(64, 128, 256, 512), time_cap_s=60.0,
                     stall_decoders=4, stall_decoder_prompt=32, stall_arrival_after=4,
                     stall_long_prompts=(128, 256), stall_budgets=(32, 64), stall_tail_steps=2,
                     capstone_users=4, capstone_prompt=64, capstone_token_budget=68,
                     capstone_kv_dtypes=("fp32", "fp8"), capstone_repeats=3,
                     decode_profile_points=((2, 64),), engine_prefill_chunks=(32,))
        return cls(**{**sizes, **overrides})

    @classmethod
    def quick(cls, **overrides) -> BenchConfig:
        """A learner's own GPU (a free notebook's T4 or L4 included) in at most ~5 minutes: fewer points and
        repeats, every section still there (fp16 where the card has no bf16: the preflight decides)."""
        sizes = dict(is_quick=True, warmup=1, repeats=3, matmul_n=4096, copy_bytes=2**29,
                     prefill_prompt_tokens=4096, chunk_sizes=(256, 512, 1024, 4096),
                     decode_batch_sizes=(1, 8, 32, 64), decode_contexts=(1024, 4096),
                     attention_contexts=(1024, 4096, 16384), stall_long_prompts=(8192,),
                     stall_budgets=(512,), capstone_users=16, capstone_prompt=4096,
                     capstone_token_budget=4112, capstone_repeats=2,
                     decode_profile_points=((1, 4096), (32, 4096)), engine_prefill_chunks=(512,),
                     time_cap_s=240.0)
        return cls(**{**sizes, **overrides})

    def model_spec(self) -> ModelSpec:  # measured under the name "llama-3-8b"
        spec = TOY if self.is_toy else LLAMA3_8B
        return spec if self.num_layers is None else resized(spec, num_layers=self.num_layers)

    def capstone_users_for(self, kv_dtype: str) -> int:
        """The capstone's users with a pool in ``kv_dtype``: ``capstone_users`` unless fewer fit."""
        return dict(self.capstone_users_by_kv).get(kv_dtype, self.capstone_users)


@dataclass
class Run:
    """One run in progress: its record, its model once built, the current section's deadline (its weight's
    share of the time left when it starts)."""

    record: dict
    config: BenchConfig
    device: object  # torch.device
    dtype: object  # torch.dtype
    log: Callable[[str], None]
    llama: object = None  # longctx.model.llama.Llama
    start: float = field(default_factory=time.monotonic)
    deadline: float = 0.0

    def begin(self, section: str, remaining: list[str]) -> None:  # the section's deadline
        left = self.config.time_cap_s - (time.monotonic() - self.start)
        self.deadline = time.monotonic() + max(0.0, left) * SECTION_WEIGHTS[section] / sum(
            SECTION_WEIGHTS[s] for s in remaining)

    def model(self, name: str):
        """The random-weight ``Llama`` recorded as ``name`` (built by the first section that asks)."""
        if self.llama is None:
            from longctx.model.llama import Llama

            spec = self.config.model_spec()
            self.llama = Llama(spec, device=self.device, dtype=self.dtype).init_random_(0).eval()
            self.record["models"][name] = {"config": spec_to_dict(spec), "num_params": spec.num_params}
        return self.llama

    def cost(self, spec: ModelSpec, sequences) -> StepCost:  # flops.step_cost in this run's dtype
        return step_cost(spec, sequences, weight_dtype=self.config.dtype, kv_dtype=self.config.dtype)

    def time(self, fn, warmup: int | None = None, repeats: int | None = None) -> Timing:
        c = self.config
        return time_fn(fn, self.device, c.warmup if warmup is None else warmup,
                       c.repeats if repeats is None else repeats)

    def point(self, what: str, fn, timed: bool = True):
        """``fn()``; or None, with ``what`` listed under ``skipped`` when the section's time is up (``timed``)
        or the device runs out of memory, and under ``errors`` for any other exception (one failed point
        must not lose a whole GPU run)."""
        import torch

        from longctx.gpu.serving_sections import OverCap

        if timed and time.monotonic() >= self.deadline:
            self.record["skipped"].append(f"{what} (time cap)")
            return None
        try:
            return fn()
        except torch.OutOfMemoryError:
            self.record["skipped"].append(f"{what} (out of memory)")
        except OverCap as exc:
            self.record["skipped"].append(f"{what} (time cap: {exc})")
        except Exception as exc:  # recorded and printed, never hidden: the tests require errors == []
            self.record["errors"].append(f"{what}: {type(exc).__name__}: {exc}"[:500])
            self.log(f"  ERROR {what}: {type(exc).__name__}: {exc}")
        self.free_memory()
        return None

    def fallback(self, line: str) -> None:
        """Record one line saying what could not run as asked and what runs instead (the run goes on)."""
        self.record.setdefault("fallbacks", []).append(line)
        self.log(f"  FALLBACK {line}")

    def free_memory(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()


def run_suite(config: BenchConfig, device=None, log: Callable[[str], None] | None = None,
              checkpoint: Callable[[dict], None] | None = None, free_bytes: float | None = None) -> dict:
    """The record (``longctx.gpu.records``) of ``config``'s sections on ``device`` (default: CUDA if any).
    ``checkpoint(record)`` is called after each section (``complete`` False until the end): a run killed
    from outside keeps what it measured. ``free_bytes``: the device memory to size the sections for
    (default: what CUDA reports free; on a CPU, none: sizes as configured)."""
    import torch

    from longctx.gpu import sections
    from longctx.gpu.preflight import preflight

    start = time.monotonic()  # the cap counts the preflight's compiles too
    log, device = (log or (lambda _msg: None),
                   torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    log("[preflight] ...")
    config, pre = preflight(config, device, free_bytes)
    for line in pre["fallbacks"] + pre["shrunk"]:
        log(f"  {line}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[config.dtype]
    record = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "toy": config.is_toy, "quick": config.is_quick, "dtype": config.dtype,
              "device": device_provenance(device), "config": asdict(config), "preflight": pre,
              "fallbacks": list(pre["fallbacks"]),
              "notes": "random-weight longctx.model.llama over the engine's paged KV cache, each row naming "
                       "its attention backend (reference: SDPA; fused: one call per chunk, FlexAttention "
                       "over the pool for decodes): this engine's speed, not vLLM's",
              "models": {}, "errors": [], "skipped": []}
    run = Run(record, config, device, dtype, log, start=start)
    todo = [s for s in SECTION_WEIGHTS if s in config.sections or s == "ceilings"]  # every reader needs these
    threads = torch.get_num_threads()
    if device.type == "cpu":  # tiny CPU kernels: one thread avoids OpenMP barriers stalling on a busy machine
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for i, section in enumerate(todo):
                run.begin(section, todo[i:])
                t0 = time.monotonic()
                log(f"[{section}] ...")
                run.point(f"section {section}", lambda s=section: getattr(sections, s)(run, "llama-3-8b"),
                          timed=False)
                run.free_memory()
                log(f"[{section}] done in {time.monotonic() - t0:.1f} s")
                if checkpoint is not None and i + 1 < len(todo):
                    checkpoint({**record, "wall_s": round(time.monotonic() - run.start, 3),
                                "complete": False})
    finally:
        run.llama = None
        run.free_memory()
        torch.set_num_threads(threads)
    record["wall_s"], record["complete"] = round(time.monotonic() - run.start, 3), True
    return record
