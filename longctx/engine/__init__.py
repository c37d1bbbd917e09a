"""The engine: sequences, schedulers, executors, the step loop and serving metrics.

Nothing imported here needs torch; the names that run the real model load it on first use.

API summary::

    from longctx.engine import Engine, ChunkedPrefillScheduler, MonolithicScheduler, VirtualClock, ToyExecutor

    engine = Engine(executor, scheduler, num_blocks=512, block_size=16, clock=None)  # None: WallClock
    seq = engine.add_request(prompt_token_ids, max_tokens=32, arrival_s=0.0,       # -> Sequence
                             sampling=SamplingParams(temperature=0.8, seed=1))    # None: greedy
    engine.step()             # one iteration -> StepRecord (or None when idle); engine.history keeps them
    engine.run_until_done()   # -> finished sequences
    engine.abort(seq_id)      # drop a request, free its blocks -> bool
    engine.counters           # EngineCounters: prompt/generation tokens, preemptions, prefix-cache lookups
    seq.token_times_s, seq.ttft_s, seq.itl_s, seq.output_token_ids
    summarize(engine.finished, slo=SLO(ttft_s=1.0))  # -> RunMetrics: ttft/itl/tpot/e2e Distributions

- ``Sequence`` (sequence.py): prompt_token_ids, output_token_ids, num_computed_tokens (positions),
  num_evicted_tokens (KV pruning), status (WAITING / RUNNING / FINISHED), arrival_s, token_times_s;
  properties num_cached_tokens, num_uncomputed_tokens, is_decode, is_prefill, is_prefill_in_progress,
  ttft_s, itl_s.
- ``Scheduler`` (scheduler.py): subclass and write ONE method, ``schedule(self, running, waiting, batch)``:
  add entries with ``batch.add(seq, num_tokens) -> bool`` (batch.py: it reserves the KV slots, admits
  waiting sequences within ``max_num_seqs``, preempts newer running sequences by recompute when the pool is
  short, and refuses entries over ``token_budget``); ``batch.budget_left`` is what is left of the budget.
  ``ScheduledBatch.entries`` is a list of ``ScheduledChunk(seq, num_tokens)``. Shipped:
  ``MonolithicScheduler(max_num_batched_tokens=None)``, ``PrefillFirstChunkedScheduler(token_budget=512)``
  (chunks, but a step is prefill or decode) and ``ChunkedPrefillScheduler(token_budget=512)`` (stall-free).
- Executors (executor.py): subclass ``Executor`` and write ``execute(batch) -> ExecutionResult(duration_s,
  next_token_ids | None, evicted_tokens | None)``; ``block_manager`` (own pool or None), ``check_prompt`` and
  ``forget`` have defaults. ``ToyExecutor`` (linear cost, dummy tokens), ``TorchExecutor(model,
  block_manager, press=None, kv_dtype=None)`` (the real model; its cache is built from that pool and the
  engine uses the same pool; it samples each sequence's tokens with its ``SamplingParams``: sampling.py,
  sampler.py; a ``longctx.kv.press`` press prunes each prompt's KV cache when its prefill ends and the
  freed blocks return to the pool: pruning.py). ``BlockManager(..., enable_prefix_caching=True)`` shares
  cached full blocks, from the step that fills them (batch.py).
- Clocks (clock.py): ``WallClock`` (perf_counter) and ``VirtualClock`` (advanced by each step's duration_s).
- Metrics (``longctx.metrics``, shared with the simulator and the benchmark client):
  ``RequestMetrics.from_timestamps``, ``request_metrics(seq)``, ``summarize``, ``SLO``, ``percentile``:
  vLLM benchmark_serving's definitions.

The real model in three lines (llm.py)::

    from longctx.engine import build_engine
    engine, tokenizer = build_engine(ChunkedPrefillScheduler(token_budget=64))  # 256 blocks of 16 by default
    seq = engine.add_request(tokenizer.encode_chat("Hi!"), max_tokens=16); engine.run_until_done()

Also ``generate(model, prompt_ids, max_tokens, chunk_size=None)`` (llm.py) and
``chunked_prefill_max_diff(model, prompt_ids, chunk_sizes=(1, 7, 64, 512)) -> {chunk_size: max |dlogit|}``
(exactness.py: chunked prefill is exact up to floating-point rounding; this measures the rounding).
"""

from longctx.engine.batch import ScheduledBatch, ScheduledChunk
from longctx.engine.clock import Clock, VirtualClock, WallClock
from longctx.engine.engine import Engine, EngineCounters, StepRecord
from longctx.engine.executor import ExecutionResult, Executor, ToyExecutor
from longctx.engine.sampling import SamplingParams
from longctx.engine.scheduler import (
    ChunkedPrefillScheduler,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    Scheduler,
)
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.metrics import SLO, RequestMetrics, RunMetrics, percentile, request_metrics, summarize

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
