"""The simulator's run loop: the real ``Engine`` with a ``CostModelExecutor`` and a ``VirtualClock``.

Nothing is re-implemented: the scheduler, the block manager (KV capacity, preemption by recompute) and
the metrics are the engine's own. Only the executor (modelled time, no tokens) and the clock differ, so a
policy written for the real model runs unchanged at H100 scale.

KV pool: what is left of ``gpu_memory_utilization * memory_bytes`` after the weights, in blocks of
``block_size`` tokens (activation memory is ignored, so the pool is slightly optimistic); or a pool of
``pool_gib`` GiB (``longctx.plan.pool_blocks``, the planner's ``plan(...).pool_blocks``); both sizes come
from ``memory.blocks_that_fit``. A token takes ``longctx.kv.quant.pool_bytes_per_token(model, kv_dtype)``
bytes, quantization scales included, as in the engine's ``PagedKVCache`` and the planner (for
fp32/fp16/bf16 this is ``memory.kv_bytes_per_token``).

Prefix caching (``prefix_caching=True``): the engine's ``BlockManager(enable_prefix_caching=True)``. The
simulator has no text, so token ids are made up: with ``shared_prefix_tokens = P`` every prompt starts
with the same ``P`` ids ``1..P``, then ids of its own (``-(i + 1)`` for request ``i``), so requests share
the prefix's full blocks and nothing past it (``sim_prompt_ids``).
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from longctx import checks
from longctx.engine import SLO, Engine, Scheduler, StepRecord, VirtualClock, summarize
from longctx.kv.hybrid import block_manager_for
from longctx.kv.quant import pool_bytes_per_token
from longctx.plan import pool_blocks
from longctx.request_metrics import RequestMetrics, RunMetrics, request_metrics
from longctx.sim.cost_model import CostFactors, CostModelExecutor
from longctx.sim.workload import Request
from longctx.specs import HardwareSpec, ModelSpec, dtype_bytes, get_hardware, get_model

LATENCY_KEYS = ("p50", "p90", "p95", "p99", "mean")  # what to_dict reports of each latency


def kv_pool_blocks(
    model: ModelSpec | str, hardware: HardwareSpec | str, block_size: int = 16,
    gpu_memory_utilization: float = 0.9, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
) -> int:
    """KV blocks that fit what the GPU leaves: ``plan.pool_blocks`` of ``utilization * memory - weight bytes``
    (KV bytes per token from ``quant.pool_bytes_per_token``, scales included)."""
    m, hw = get_model(model), get_hardware(hardware)
    checks.unit_fraction("gpu_memory_utilization", gpu_memory_utilization, "of the GPU's memory")
    free_bytes = gpu_memory_utilization * hw.memory_bytes - m.num_params * dtype_bytes(weight_dtype)
    if free_bytes < block_size * pool_bytes_per_token(m, kv_dtype):
        raise ValueError(
            f"{m.name} ({weight_dtype} weights) leaves no room for a KV cache in "
            f"{gpu_memory_utilization:.0%} of {hw.name}'s {hw.memory_bytes / 1e9:.0f} GB"
        )
    return pool_blocks(m, kv_dtype, block_size, pool_bytes=free_bytes)


def sim_prompt_ids(index: int, prompt_tokens: int, shared_prefix_tokens: int = 0) -> list[int]:
    """Made-up token ids of request ``index``: ``1..P`` (the shared prefix), then ``-(index + 1)`` repeated
    (its own tokens: no block past the prefix equals another request's). The simulator checks no
    vocabulary."""
    if shared_prefix_tokens > prompt_tokens:
        raise ValueError(
            f"shared_prefix_tokens={shared_prefix_tokens} is longer than request {index}'s prompt of "
            f"{prompt_tokens} tokens"
        )
    return list(range(1, shared_prefix_tokens + 1)) + [-(index + 1)] * (prompt_tokens - shared_prefix_tokens)


@dataclass
class SimResult:
    """A finished simulation: per-request metrics, aggregate metrics, every step, and the configuration."""

    config: dict
    requests: list[RequestMetrics]
    metrics: RunMetrics
    steps: list[StepRecord]
    scheduling_delay_s: list[float]  # first scheduled - arrival, per request (Sarathi-Serve's queueing delay)
    num_preemptions: int
    wall_s: float = field(default=0.0, compare=False)
    prefix_hit_tokens: int = 0  # sum of Sequence.num_prefix_cached_tokens (each request's last admission)
    num_evictions: int = 0  # cached blocks the prefix cache evicted to make room

    @property
    def peak_used_blocks(self) -> int:
        """Most blocks sequences held during a step (a shared block counts once)."""
        return max((s.num_used_blocks for s in self.steps), default=0)

    @property
    def prefill_tokens(self) -> int:
        """Tokens the steps prefilled (recomputes included, prefix-cache hits excluded)."""
        return sum(s.num_prefill_tokens for s in self.steps)

    def to_dict(self) -> dict:
        """JSON-ready summary: ``ttft_s``, ``tpot_s``, ``itl_s``, ``e2e_s`` (p50/p90/p95/p99/mean) etc."""
        m = self.metrics

        def dist(d) -> dict:  # NaN (e.g. no TPOT with 1-token outputs) -> null in JSON
            return d.to_dict(LATENCY_KEYS, empty=None)

        return {
            "config": self.config, "completed": m.completed, "duration_s": m.duration_s,
            "ttft_s": dist(m.ttft), "tpot_s": dist(m.tpot), "itl_s": dist(m.itl), "e2e_s": dist(m.e2e),
            "throughput_tok_s": m.output_throughput, "total_throughput_tok_s": m.total_token_throughput,
            "request_throughput_req_s": m.request_throughput, "goodput_req_s": m.goodput,
            "scheduling_delay_s": {"p50": _num(np.median(self.scheduling_delay_s))},
            "num_steps": len(self.steps), "num_preemptions": self.num_preemptions,
            "prefill_tokens": self.prefill_tokens, "prefix_hit_tokens": self.prefix_hit_tokens,
            "num_evictions": self.num_evictions, "peak_used_blocks": self.peak_used_blocks,
        }


def _num(x: float) -> float | None:
    x = float(x)
    return None if x != x else x  # NaN (e.g. no TPOT with 1-token outputs) -> null in JSON


def build_sim_engine(
    scheduler: Scheduler, model: ModelSpec | str = "llama-3-8b", hardware: HardwareSpec | str = "h100",
    factors: CostFactors | None = None, block_size: int = 16, num_blocks: int | None = None,
    gpu_memory_utilization: float = 0.9, max_model_len: int | None = None, weight_dtype: str = "bf16",
    kv_dtype: str = "bf16", kv_compression_ratio: float = 0.0, prefix_caching: bool = False,
    pool_gib: float | None = None,
) -> Engine:
    """An ``Engine`` with a ``CostModelExecutor`` and a ``VirtualClock``; KV pool sized from the GPU, or
    ``num_blocks`` blocks, or ``pool_gib`` GiB (not both). ``kv_compression_ratio``: KV pruning at the end
    of each prefill (``CostModelExecutor``). ``prefix_caching``: a ``BlockManager`` with prefix caching
    (cannot be combined with KV pruning)."""
    m, hw = get_model(model), get_hardware(hardware)
    if prefix_caching and kv_compression_ratio:
        raise ValueError(
            f"prefix_caching cannot be combined with kv_compression_ratio={kv_compression_ratio}: KV pruning "
            "rewrites a sequence's blocks, which prefix caching shares"
        )
    if num_blocks is not None and pool_gib is not None:
        raise ValueError("give num_blocks or pool_gib (the KV pool's size), not both")
    executor = CostModelExecutor(
        m, hw, factors, weight_dtype, kv_dtype, kv_compression_ratio=kv_compression_ratio
    )
    if pool_gib is not None:
        num_blocks = pool_blocks(m, kv_dtype, block_size, pool_gib=pool_gib)
    elif num_blocks is None:
        num_blocks = kv_pool_blocks(m, hw, block_size, gpu_memory_utilization, weight_dtype, kv_dtype)
    if max_model_len is None:
        max_model_len = m.max_context or num_blocks * block_size
    bm = block_manager_for(m, num_blocks, block_size, enable_prefix_caching=prefix_caching)
    return Engine(executor, scheduler, block_manager=bm, clock=VirtualClock(), max_model_len=max_model_len)


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off inside the block (back on after, if it was on). A simulation
    makes no reference cycles (reference counting frees everything), and each collection would walk every
    live sequence and its token lists: about 5 % of a 10,000-request run. The engine is gone by the time
    the collector is back, so its first collection walks only what the caller keeps."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _run_until_done(engine: Engine, num_requests: int, progress: bool) -> None:
    """Step ``engine`` until every request finished; ``progress``: a tqdm bar on stderr (finished requests,
    updated every 100)."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=num_requests, unit="req", file=sys.stderr, desc="simulating", leave=False)
    done = 0
    while engine.has_unfinished():
        engine.step()
        if bar is not None and len(engine.finished) - done >= 100:
            bar.update(len(engine.finished) - done)
            done = len(engine.finished)
    if bar is not None:
        bar.update(len(engine.finished) - done)
        bar.close()


def _config(engine: Engine, scheduler: Scheduler, model, hardware, num_requests: int, block_size: int,
            kv_compression_ratio: float, weight_dtype: str, kv_dtype: str, pool_gib: float | None,
            prefix_caching: bool, shared_prefix_tokens: int) -> dict:
    """What a simulation ran (``SimResult.config``)."""
    m, hw = get_model(model), get_hardware(hardware)
    return {
        "model": m.name, "gpu": hw.name, "scheduler": repr(scheduler),
        "token_budget": getattr(scheduler, "token_budget", None), "num_requests": num_requests,
        "num_blocks": engine.block_manager.num_blocks, "block_size": block_size,
        "kv_compression_ratio": kv_compression_ratio, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
        "pool_bytes_per_token": pool_bytes_per_token(m, kv_dtype), "pool_gib": pool_gib,
        "prefix_caching": bool(prefix_caching), "shared_prefix_tokens": shared_prefix_tokens,
        "factors": vars(engine.executor.factors),
    }


@collector_paused()  # (a context manager is also a decorator: each call of simulate runs inside one)
def simulate(
    workload: list[Request], scheduler: Scheduler, model: ModelSpec | str = "llama-3-8b",
    hardware: HardwareSpec | str = "h100", factors: CostFactors | None = None, slo: SLO | None = None,
    block_size: int = 16, num_blocks: int | None = None, gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None, progress: bool = False, kv_compression_ratio: float = 0.0,
    weight_dtype: str = "bf16", kv_dtype: str = "bf16", pool_gib: float | None = None,
    prefix_caching: bool = False, shared_prefix_tokens: int = 0,
) -> SimResult:
    """Run ``workload`` through the engine with modelled step times; returns a ``SimResult``.

    KV pool: ``num_blocks`` blocks, or ``pool_gib`` GiB of ``kv_dtype`` (not both), else what the GPU
    leaves after the ``weight_dtype`` weights. ``prefix_caching``: the block manager shares cached full
    blocks; ``shared_prefix_tokens``: every prompt starts with the same that many tokens (at most each
    prompt's length; see ``sim_prompt_ids``). ``progress=True`` draws a tqdm bar on stderr (finished
    requests). Deterministic: no wall time enters the result except ``wall_s``.
    """
    if not workload:
        raise ValueError("the workload is empty")
    if (isinstance(shared_prefix_tokens, bool) or int(shared_prefix_tokens) != shared_prefix_tokens
            or shared_prefix_tokens < 0):
        raise ValueError(f"shared_prefix_tokens must be an integer >= 0, got {shared_prefix_tokens!r}")
    shared_prefix_tokens = int(shared_prefix_tokens)
    t0 = time.perf_counter()
    engine = build_sim_engine(scheduler, model, hardware, factors, block_size, num_blocks,
                              gpu_memory_utilization, max_model_len, weight_dtype, kv_dtype,
                              kv_compression_ratio=kv_compression_ratio, prefix_caching=prefix_caching,
                              pool_gib=pool_gib)
    for i, r in enumerate(workload):
        ids = sim_prompt_ids(i, r.prompt_tokens, shared_prefix_tokens)
        engine.add_request(ids, r.output_tokens, arrival_s=r.arrival_s)
    _run_until_done(engine, len(workload), progress)
    seqs = sorted(engine.finished, key=lambda s: s.seq_id)
    reqs = [request_metrics(s) for s in seqs]
    config = _config(engine, scheduler, model, hardware, len(workload), block_size, kv_compression_ratio,
                     weight_dtype, kv_dtype, pool_gib, prefix_caching, shared_prefix_tokens)
    return SimResult(
        config=config, requests=reqs, metrics=summarize(reqs, slo=slo), steps=engine.history,
        scheduling_delay_s=[s.first_scheduled_s - s.arrival_s for s in seqs],
        num_preemptions=sum(s.num_preemptions for s in seqs), wall_s=time.perf_counter() - t0,
        prefix_hit_tokens=sum(s.num_prefix_cached_tokens for s in seqs),
        num_evictions=engine.block_manager.num_evictions,
    )
