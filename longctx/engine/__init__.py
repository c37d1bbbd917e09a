"""The engine: sequences, schedulers, executors, the step loop and serving metrics.

Nothing imported here needs torch; ``TorchExecutor`` (the real model) is loaded on first use.

API summary::

    from longctx.engine import Engine, ChunkedPrefillScheduler, MonolithicScheduler, VirtualClock, ToyExecutor

    engine = Engine(executor, scheduler, num_blocks=512, block_size=16, clock=None)  # None: WallClock
    seq = engine.add_request(prompt_token_ids, max_tokens=32, arrival_s=0.0)       # -> Sequence
    engine.step()             # one iteration -> StepRecord (or None when idle); engine.history keeps them
    engine.run_until_done()   # -> finished sequences
    seq.token_times_s, seq.ttft_s, seq.itl_s, seq.output_token_ids
    summarize(engine.finished, slo=SLO(ttft_s=1.0))  # -> RunMetrics: ttft/itl/tpot/e2e Distributions

- ``Sequence`` (sequence.py): prompt_token_ids, output_token_ids, num_computed_tokens, status
  (WAITING / RUNNING / FINISHED), arrival_s, token_times_s; properties num_uncomputed_tokens, is_decode,
  is_prefill, is_prefill_in_progress, ttft_s, itl_s.
- ``Scheduler`` (scheduler.py): subclass and write ONE method,
  ``schedule(self, running, waiting, block_manager) -> ScheduledBatch``; add each entry with the helper
  ``self.reserve(batch, seq, num_tokens, running, block_manager) -> bool`` (reserves KV slots, preempts by
  recompute when the pool is short). Set ``self.token_budget`` (or None) and ``self.max_num_seqs``.
  ``ScheduledBatch.entries`` is a list of ``ScheduledChunk(seq, num_tokens)``. Shipped:
  ``MonolithicScheduler(max_num_batched_tokens=None)`` and ``ChunkedPrefillScheduler(token_budget=512)``.
- Executors (executor.py): ``execute(batch) -> ExecutionResult(duration_s, next_token_ids | None)``.
  ``ToyExecutor`` (linear cost, dummy tokens), ``TorchExecutor`` (torch_executor.py, the real model).
- Clocks (clock.py): ``WallClock`` (perf_counter) and ``VirtualClock`` (advanced by each step's duration_s).
- Metrics (metrics.py): ``RequestMetrics.from_timestamps``, ``request_metrics(seq)``, ``summarize``,
  ``SLO``, ``percentile``: vLLM benchmark_serving's definitions.

The real model in three lines::

    from longctx.engine.torch_executor import build_engine
    engine, tokenizer = build_engine(ChunkedPrefillScheduler(token_budget=64))  # 256 blocks of 16 by default
    seq = engine.add_request(tokenizer.encode_chat("Hi!"), max_tokens=16); engine.run_until_done()

``torch_executor`` also has ``generate(model, prompt_ids, max_tokens, chunk_size=None)`` and
``chunked_prefill_max_diff(model, prompt_ids, chunk_sizes=(1, 7, 64, 512)) -> {chunk_size: max |dlogit|}``
(chunked prefill is exact up to floating-point rounding; this measures the rounding).

A learner's policy plugs in as ``Engine(executor, MyScheduler(), num_blocks=...)``: subclass ``Scheduler``,
write ``schedule``, add entries with ``self.reserve``; the engine checks the contract every step.
"""

from longctx.engine.clock import Clock, VirtualClock, WallClock
from longctx.engine.engine import Engine, StepRecord
from longctx.engine.executor import ExecutionResult, Executor, ToyExecutor
from longctx.engine.metrics import SLO, RequestMetrics, RunMetrics, percentile, request_metrics, summarize
from longctx.engine.scheduler import (
    ChunkedPrefillScheduler,
    MonolithicScheduler,
    ScheduledBatch,
    ScheduledChunk,
    Scheduler,
)
from longctx.engine.sequence import Sequence, SequenceStatus

__all__ = [
    "SLO",
    "ChunkedPrefillScheduler",
    "Clock",
    "Engine",
    "ExecutionResult",
    "Executor",
    "MonolithicScheduler",
    "RequestMetrics",
    "RunMetrics",
    "ScheduledBatch",
    "ScheduledChunk",
    "Scheduler",
    "Sequence",
    "SequenceStatus",
    "StepRecord",
    "ToyExecutor",
    "VirtualClock",
    "WallClock",
    "percentile",
    "request_metrics",
    "summarize",
]


def __getattr__(name: str):
    if name == "TorchExecutor":  # imports torch: only on demand
        from longctx.engine.torch_executor import TorchExecutor

        return TorchExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
