"""The source's Exercise 1 on the real engine: ``num_decode_streams`` sequences decode, then one long prompt
arrives; a monolithic scheduler stalls every stream for the whole prefill, chunked prefill by at most one
budget-sized step. Same protocol as ``longctx.sim.scenarios.exercise1`` (the simulated version), here with
``longctx.engine.Engine``, the real schedulers, ``TorchExecutor`` on the GPU and a ``WallClock``.
"""

from __future__ import annotations

import statistics

import numpy as np

from longctx.engine import Engine, WallClock
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.block_manager import BlockManager, blocks_for_tokens
from longctx.sim.cost_model import RecordingExecutor


def scheduler_name(scheduler) -> str:
    budget = getattr(scheduler, "token_budget", None)
    return "monolithic" if budget is None else f"chunked-{budget}"


def run_exercise1(model, scheduler, num_decode_streams: int = 16, prompt_tokens: int = 12_000,
                  stream_context_tokens: int = 1024, warmup_steps: int = 20, tail_steps: int = 10,
                  block_size: int = 16, seed: int = 0) -> dict:
    """One run of Exercise 1 on ``model`` (a ``Llama`` on its device) with ``scheduler``.

    Returns a dict (times in seconds on the wall clock, origin at the engine's start): ``ttft_s`` of the long
    prompt, ``itl_s`` (every stream's gaps from its last token before the arrival to ``tail_steps`` after
    the prompt's first token), ``steady_itl_s`` (median gap of the warm-up steps), ``max_itl_s``,
    ``arrival_s``, ``steps`` (each ``{"sequences": [[new, cached], ...], "start_s", "end_s",
    "duration_s"}`` from the arrival on) and ``stream_token_times_s``.
    """
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    budget = getattr(scheduler, "token_budget", None)
    prompt_steps = (1 if budget is None else
                    prompt_tokens if budget <= num_decode_streams else -(-prompt_tokens // (budget - num_decode_streams)))
    max_out = warmup_steps + tail_steps + prompt_steps + 64  # never reached: the run stops first
    num_blocks = (num_decode_streams * blocks_for_tokens(stream_context_tokens + max_out, block_size)
                  + blocks_for_tokens(prompt_tokens + 16, block_size))
    recorder = RecordingExecutor(TorchExecutor(model, num_blocks, block_size))
    engine = Engine(recorder, scheduler, BlockManager(num_blocks, block_size), clock=WallClock(),
                    max_model_len=max(prompt_tokens, stream_context_tokens) + max_out)
    streams = [engine.add_request(rng.integers(0, vocab, stream_context_tokens).tolist(), max_out)
               for _ in range(num_decode_streams)]
    while not all(s.is_decode and s.num_output_tokens > 1 for s in streams):
        engine.step()
    for _ in range(warmup_steps):
        engine.step()
    steady = float(np.median([g for s in streams for g in s.itl_s[-warmup_steps:]]))
    first = {s.seq_id: len(s.token_times_s) - 1 for s in streams}
    n_hist, n_rec = len(engine.history), len(recorder.steps)
    long_req = engine.add_request(rng.integers(0, vocab, prompt_tokens).tolist(), 16)
    while not long_req.token_times_s:
        engine.step()
    for _ in range(tail_steps):
        engine.step()
    times = [s.token_times_s[first[s.seq_id]:] for s in streams]
    gaps = [float(g) for t in times for g in np.diff(t)]
    steps = [{"sequences": [list(p) for p in m.sequences], "start_s": h.start_s, "end_s": h.end_s,
              "duration_s": m.duration_s}
             for h, m in zip(engine.history[n_hist:], recorder.steps[n_rec:], strict=True)]
    return {"scheduler": scheduler_name(scheduler), "arrival_s": float(long_req.arrival_s),
            "ttft_s": float(long_req.ttft_s), "itl_s": gaps, "steady_itl_s": steady,
            "max_itl_s": max(gaps), "steps": steps, "stream_token_times_s": times}


def summarize_runs(runs: list[dict]) -> dict:
    """Pool repeated runs of one scheduler: TTFT and ITL distributions (seconds) plus the last run's steps."""
    ttfts = [r["ttft_s"] for r in runs]
    itl = [g for r in runs for g in r["itl_s"]]
    last = runs[-1]
    return {
        "scheduler": last["scheduler"],
        "ttft_s": ttfts,
        "itl_s": itl,
        "ttft_median_s": statistics.median(ttfts),
        "itl_p50_s": float(np.percentile(itl, 50)),
        "itl_p99_s": float(np.percentile(itl, 99)),
        "max_itl_s": max(itl),
        "steady_itl_s": statistics.median(r["steady_itl_s"] for r in runs),
        "arrival_s": last["arrival_s"],
        "steps": last["steps"],
        "stream_token_times_s": last["stream_token_times_s"],
    }
