"""The GPU suite behind ``python -m longctx gpu-bench``: one prepared run, a time cap, one record.

Sections (``longctx.gpu.sections``), in order: ``ceilings`` (matmul FLOP/s, copy bytes/s; always run),
``prefill_chunks``, ``decode``, ``attention_share`` (random-weight Llama-3-8B) and ``exercise1``
(``longctx.lessons.exercise1.Exercise1``, lesson 01's scenario, on the real engine). Each section gets its weight's share of the time left; a point past its
section's deadline or out of memory is listed under ``skipped``, any other failure under ``errors``, and the
run goes on. Every point is timed by ``time_fn``. ``BenchConfig.toy()`` runs it all on the CPU in seconds
with tiny fp32 models (the tests use it).
"""

from __future__ import annotations

import datetime
import gc
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from longctx.flops import StepCost, step_cost
from longctx.gpu.records import SCHEMA, device_key
from longctx.lessons.exercise1 import Exercise1
from longctx.model.config import LLAMA3_8B, spec_to_dict
from longctx.specs import ModelSpec

SECTION_WEIGHTS = {"ceilings": 0.5, "prefill_chunks": 2.0, "decode": 2.5, "attention_share": 1.0,
                   "exercise1": 2.5}
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
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then the median of ``repeats`` timed calls (the
    median resists the occasional slow repeat). On a CUDA device each repeat is bracketed by CUDA events, so
    the time is the device's, not the Python loop's, read after one ``synchronize`` at the end; on the CPU
    (toy runs, tests) ``time.perf_counter`` brackets each call."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times, timer = [start.elapsed_time(end) / 1e3 for start, end in events], "cuda-events"  # ms -> s
    else:
        times, timer = [], "perf_counter"
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return Timing(statistics.median(times), min(times), max(times), repeats, timer)


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run. ``BenchConfig()``: the real H200 run (bf16); ``toy()``: the same code, tiny."""

    is_toy: bool = False
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
    exercise1: Exercise1 = Exercise1()  # the source's sizes: 16 streams at 1K, a 12K-token prompt
    ex1_budgets: tuple[int, ...] = (512, 1024, 2048)
    ex1_repeats: int = 3
    block_size: int = 16
    time_cap_s: float = 360.0
    sections: tuple[str, ...] = tuple(SECTION_WEIGHTS)

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTION_WEIGHTS)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; allowed: {', '.join(SECTION_WEIGHTS)}")
        if not self.time_cap_s > 0:
            raise ValueError(f"time_cap_s must be > 0 seconds, got {self.time_cap_s}")

    @classmethod
    def toy(cls, **overrides) -> BenchConfig:
        sizes = dict(is_toy=True, dtype="fp32", warmup=1, repeats=3, matmul_n=256, copy_bytes=8 * 2**20,
                     prefill_prompt_tokens=256, chunk_sizes=(16, 32, 64, 128, 256),
                     decode_batch_sizes=(1, 2, 4, 8), decode_contexts=(64, 128, 256), max_decode_kv_tokens=1024,
                     attention_contexts=(64, 128, 256, 512), exercise1=Exercise1(4, 384, 64, 4, 3),
                     ex1_budgets=(64, 128), ex1_repeats=1, time_cap_s=60.0)
        return cls(**{**sizes, **overrides})

    def model_spec(self) -> ModelSpec:
        """The shape measured under the name ``llama-3-8b``: Llama-3-8B's, or ``TOY``'s in a toy run."""
        return TOY if self.is_toy else LLAMA3_8B


@dataclass
class Run:
    """One run in progress: its record, its model once built, and the current section's deadline (each
    section gets its weight's share of the time left when it starts)."""

    record: dict
    config: BenchConfig
    device: object  # torch.device
    dtype: object  # torch.dtype
    log: Callable[[str], None]
    llama: object = None  # longctx.model.llama.Llama
    start: float = field(default_factory=time.monotonic)
    deadline: float = 0.0

    def begin(self, section: str, remaining: list[str]) -> None:
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

    def cost(self, spec: ModelSpec, sequences) -> StepCost:
        """``flops.step_cost`` of one step (``params="matmul"``, causal) in this run's dtype."""
        return step_cost(spec, sequences, weight_dtype=self.config.dtype, kv_dtype=self.config.dtype)

    def time(self, fn, warmup: int | None = None, repeats: int | None = None) -> Timing:
        c = self.config
        return time_fn(fn, self.device, c.warmup if warmup is None else warmup, c.repeats if repeats is None else repeats)

    def point(self, what: str, fn, timed: bool = True):
        """``fn()``; or None, with ``what`` listed under ``skipped`` when the section's time is up (``timed``)
        or the device runs out of memory, and under ``errors`` for any other exception (one failed point
        must not lose a whole GPU run)."""
        import torch

        if timed and time.monotonic() >= self.deadline:
            self.record["skipped"].append(f"{what} (time cap)")
            return None
        try:
            return fn()
        except torch.OutOfMemoryError:
            self.record["skipped"].append(f"{what} (out of memory)")
        except Exception as exc:  # recorded and printed, never hidden: the tests require errors == []
            self.record["errors"].append(f"{what}: {type(exc).__name__}: {exc}"[:500])
            self.log(f"  ERROR {what}: {type(exc).__name__}: {exc}")
        self.free_memory()
        return None

    def free_memory(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()


def _run(args: list[str]) -> str | None:
    """The first line a command prints (run beside this package), or None when it fails."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20, cwd=pathlib.Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def device_info(device) -> dict:
    """Provenance: device name and key, torch, CUDA, driver, memory, multiprocessors; the code's commit."""
    import torch

    info = {"name": "cpu", "torch": torch.__version__, "cuda": torch.version.cuda, "driver": None,
            "python": platform.python_version(), "commit": _run(["git", "rev-parse", "HEAD"])}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, memory_bytes=int(p.total_memory), multiprocessors=int(p.multi_processor_count),
                    capability=f"{p.major}.{p.minor}",
                    driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]))
    else:
        info["processor"] = platform.processor() or platform.machine()
    return {**info, "key": device_key(info["name"])}


def run_suite(config: BenchConfig, device=None, log: Callable[[str], None] | None = None) -> dict:
    """Run the sections of ``config`` on ``device`` (default: CUDA if present, else the CPU); returns the
    record (``longctx.gpu.records``)."""
    import torch

    from longctx.gpu import sections

    log = log or (lambda _msg: None)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[config.dtype]
    record = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "toy": config.is_toy, "dtype": config.dtype, "device": device_info(device),
              "config": asdict(config),
              "notes": "random-weight models run by longctx.model.llama over the engine's paged KV cache "
                       "(torch SDPA, not a fused paged-attention kernel; a chunk after cached tokens attends in "
                       "query tiles of llama.MAX_SCORES_PER_CALL scores, as the engine does): this engine's "
                       "speed, not vLLM's",
              "models": {}, "errors": [], "skipped": []}
    run = Run(record, config, device, dtype, log)
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
                fn = getattr(sections, section)
                run.point(f"section {section}", lambda fn=fn: fn(run, "llama-3-8b"), timed=False)
                log(f"[{section}] done in {time.monotonic() - t0:.1f} s")
    finally:
        run.llama = None
        run.free_memory()
        torch.set_num_threads(threads)
    record["wall_s"] = round(time.monotonic() - run.start, 3)
    return record
