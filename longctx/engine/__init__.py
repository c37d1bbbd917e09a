"""The engine: sequences, schedulers, executors and the step loop (schedule -> commit -> execute -> update).

Importing it does not import torch: ``TorchExecutor``, ``build_engine``, ``generate``,
``chunked_prefill_logits`` and ``chunked_prefill_max_diff`` load it on first use.

- ``Engine(executor, scheduler, block_manager=None, *, num_blocks, block_size, clock, max_model_len, ...)``
  (engine.py): ``add_request(prompt_ids, max_tokens, arrival_s, sampling) -> Sequence``, ``step() ->
  StepRecord | None``, ``run_until_done()``, ``abort(seq_id)``, ``history``, ``counters``
  (``EngineCounters``: tokens, preemptions, prefix-cache lookups; step_records.py).
- ``Sequence`` / ``SequenceStatus`` (sequence.py); ``SamplingParams`` (sampling_params.py; None: greedy).
- ``Scheduler`` (scheduler.py): write ``schedule(running, waiting, batch)`` with ``batch.add(seq, n) ->
  bool`` (``ScheduledBatch`` / ``ScheduledChunk``, batch.py: reserves KV slots, admits, preempts by
  recompute, takes prefix-cache hits). Shipped: ``MonolithicScheduler``, ``PrefillFirstChunkedScheduler``,
  ``ChunkedPrefillScheduler`` (stall-free).
- ``Executor`` / ``ExecutionResult`` / ``ToyExecutor`` (executor.py); ``TorchExecutor(model,
  block_manager, press=None, kv_dtype=None)`` (torch_executor.py: the real model; a press prunes KV,
  pruning.py; ``kv_dtype`` quantizes the pool, ``longctx.kv.quant``).
- ``build_engine(scheduler, num_blocks, block_size, kv_dtype=None, enable_prefix_caching=False,
  press=None) -> (engine, tokenizer)`` and ``generate(model, prompt_ids, max_tokens, chunk_size)``
  (llm.py); ``chunked_prefill_max_diff`` / ``chunked_prefill_logits`` (exactness.py).
- ``WallClock`` / ``VirtualClock`` / ``Clock`` (clock.py).
- Re-exported from ``longctx.request_metrics``: ``SLO``, ``RequestMetrics``, ``RunMetrics``, ``percentile``,
  ``request_metrics``, ``summarize`` (vLLM benchmark_serving's definitions).
"""

from typing import TYPE_CHECKING

from longctx.engine.batch import ScheduledBatch, ScheduledChunk
from longctx.engine.clock import Clock, VirtualClock, WallClock
from longctx.engine.engine import Engine, EngineCounters, StepRecord
from longctx.engine.executor import ExecutionResult, Executor, ToyExecutor
from longctx.engine.sampling_params import SamplingParams
from longctx.engine.scheduler import (
    ChunkedPrefillScheduler,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    Scheduler,
)
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.request_metrics import SLO, RequestMetrics, RunMetrics, percentile, request_metrics, summarize

__all__ = [
    "SLO",
    "ChunkedPrefillScheduler",
    "Clock",
    "Engine",
    "EngineCounters",
    "ExecutionResult",
    "Executor",
    "MonolithicScheduler",
    "PrefillFirstChunkedScheduler",
    "RequestMetrics",
    "RunMetrics",
    "SamplingParams",
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


if TYPE_CHECKING:  # for editors and type checkers; at run time __getattr__ below loads them
    from longctx.engine.exactness import chunked_prefill_logits as chunked_prefill_logits
    from longctx.engine.exactness import chunked_prefill_max_diff as chunked_prefill_max_diff
    from longctx.engine.llm import build_engine as build_engine
    from longctx.engine.llm import generate as generate
    from longctx.engine.torch_executor import TorchExecutor as TorchExecutor

_ON_DEMAND = {  # these import torch: only when asked for
    "TorchExecutor": "longctx.engine.torch_executor",
    "build_engine": "longctx.engine.llm",
    "generate": "longctx.engine.llm",
    "chunked_prefill_logits": "longctx.engine.exactness",
    "chunked_prefill_max_diff": "longctx.engine.exactness",
}


def __getattr__(name: str):
    if name in _ON_DEMAND:
        import importlib

        return getattr(importlib.import_module(_ON_DEMAND[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
