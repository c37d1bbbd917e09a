"""The GPU suite's serving sections: the course's central experiments run through the engine itself
(``Engine`` + ``TorchExecutor`` + ``WallClock``, random-weight Llama-3-8B), each run a point of ``run.point``.

- ``stall``: ``stall_decoders`` requests are decoding when one long prompt arrives; monolithic prefill against
  chunked prefill at each budget; per run, every decoder's inter-token gaps from its last token before the
  arrival to ``stall_tail_steps`` steps after the long prompt's first token (median, P99, max over all of
  them) and the long prompt's TTFT. One untimed warm-up run per scheduler (the shortest long prompt), then
  ``stall_repeats`` rounds over every cell (a round visits each cell once: a time cap leaves every cell with
  fewer runs, never some cells with none); each row keeps its runs, so ``n`` and the spread are in the record.
- ``capstone``: ``capstone_users`` prompts arrive at once, outputs long enough that every user decodes at once
  (``peak_resident`` checks it); per KV dtype: pool blocks and bytes, peak GPU memory, TTFT and ITL.

An engine run checks the section's deadline every step: past it, the run stops (``OverCap``) and the point
is listed under ``skipped``.
"""

from __future__ import annotations

import statistics
import time

import torch

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, WallClock, percentile
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.block_manager import BlockManager
from longctx.memory import blocks_for_tokens


class OverCap(Exception):
    """An engine run passed its section's deadline and was stopped (``Run.point`` lists it as skipped)."""


def _engine(ctx, name: str, scheduler, num_blocks: int, max_model_len: int, kv_dtype: str | None = None,
            backend: str | None = None):
    """A fresh engine over a pool of ``num_blocks``, with ``backend`` or the run's serving backend (``fused``
    asked for with a quantized pool, which it cannot read, becomes ``auto``: the row names what ran);
    ``(engine, backend that ran)``."""
    model, bs = ctx.model(name), ctx.config.block_size
    backend = backend or ctx.config.serving_backend
    if kv_dtype is not None and backend == "fused":
        backend = "auto"
    executor = TorchExecutor(model, BlockManager(num_blocks, bs), kv_dtype=kv_dtype,
                             attention_backend=backend)
    engine = Engine(executor, scheduler, clock=WallClock(), max_model_len=max_model_len, eos_token_id=-1)
    return engine, executor.attention_backend_choice.name


def _step_until(ctx, engine: Engine, done) -> None:
    """Step ``engine`` until ``done()``; ``OverCap`` past the section's deadline."""
    while not done():
        if time.monotonic() >= ctx.deadline:
            raise OverCap(f"stopped after {len(engine.history)} steps")
        if engine.step() is None:
            raise RuntimeError("the engine had nothing to do before the run ended (a request was refused?)")


def _prompt(ctx, n: int, seed: int) -> list[int]:
    vocab = ctx.config.model_spec().vocab_size
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _scheduler(budget: int | None):
    return MonolithicScheduler() if budget is None else ChunkedPrefillScheduler(token_budget=budget)


def stall_run(ctx, name: str, long_prompt: int, budget: int | None, seed: int = 0) -> dict:
    """One run of the stall scenario: D decoders past their ``stall_arrival_after``-th token, then the long
    prompt (one output token: its TTFT) arrives; returns the run's numbers."""
    c = ctx.config
    D, tail = c.stall_decoders, c.stall_tail_steps
    def steps_for(tokens: int) -> int:  # steps to prefill ``tokens`` beside the D decodes (monolithic: one)
        return 1 if budget is None else blocks_for_tokens(tokens, max(1, budget - D)) + 1

    # the first decoder decodes while the others prefill: no decoder may finish inside the window
    out = steps_for(D * c.stall_decoder_prompt) + c.stall_arrival_after + steps_for(long_prompt) + tail + 8
    bs = c.block_size
    blocks = (D * blocks_for_tokens(c.stall_decoder_prompt + out, bs)
              + blocks_for_tokens(long_prompt + 1, bs) + D)
    engine, backend = _engine(ctx, name, _scheduler(budget), blocks,
                              max(long_prompt, c.stall_decoder_prompt) + out)
    t0 = time.perf_counter()
    decoders = [engine.add_request(_prompt(ctx, c.stall_decoder_prompt, seed * 1000 + i), out)
                for i in range(D)]
    _step_until(ctx, engine, lambda: all(len(s.token_times_s) >= c.stall_arrival_after for s in decoders))
    steady = statistics.median(g for s in decoders for g in s.itl_s)
    first = [len(s.token_times_s) - 1 for s in decoders]
    n_steps = len(engine.history)
    long_req = engine.add_request(_prompt(ctx, long_prompt, seed * 1000 + 999), 1)
    _step_until(ctx, engine, lambda: bool(long_req.token_times_s))
    end = len(engine.history) + tail
    _step_until(ctx, engine, lambda: len(engine.history) >= end)
    per = [[b - a for a, b in zip(s.token_times_s[i:], s.token_times_s[i + 1:], strict=False)]
           for s, i in zip(decoders, first, strict=True)]  # each decoder's gaps after the arrival
    gaps, worst = [g for p in per for g in p], [max(p) for p in per]
    steps = engine.history[n_steps:]
    if any(s.is_finished for s in decoders):
        raise RuntimeError("a decoder finished inside the window: its gaps would be missing "
                           "(output too short)")
    return {"attention_backend": backend, "long_ttft_s": long_req.ttft_s,
            "itl_median_s": statistics.median(gaps), "itl_p99_s": percentile(gaps, 99),
            "itl_max_s": max(gaps), "decoder_gaps_after_arrival": len(gaps),
            "decoder_worst_gap_min_s": min(worst), "decoder_worst_gap_median_s": statistics.median(worst),
            "steady_itl_s": steady, "max_step_s": max(r.duration_s for r in steps), "steps": len(steps),
            "wall_s": time.perf_counter() - t0}


def stall(ctx, name: str) -> None:
    """Monolithic against chunked prefill at each budget, for each long prompt: rows with their runs."""
    c = ctx.config
    budgets = (None, *c.stall_budgets)
    rows = {(L, b): {"long_prompt": L, "scheduler": "monolithic" if b is None else "chunked",
                     "token_budget": b, "decoders": c.stall_decoders,
                     "decoder_prompt": c.stall_decoder_prompt, "runs": []}
            for L in c.stall_long_prompts for b in budgets}
    # warm-up: one untimed run per scheduler at the shortest long prompt (kernels, compiles)
    for b in budgets:
        ctx.point(f"{name} stall warm-up {_label(b)}",
                  lambda b=b: stall_run(ctx, name, min(c.stall_long_prompts), b))
    for rep in range(c.stall_repeats):
        for (L, b), row in rows.items():
            what = f"{name} stall {L} {_label(b)} run {rep + 1}"
            if (res := ctx.point(what, lambda L=L, b=b, rep=rep:
                                 stall_run(ctx, name, L, b, seed=rep + 1))) is None:
                continue
            row["attention_backend"] = res.pop("attention_backend")
            row["runs"].append(res)
            ctx.log(f"  {what:<40}: TTFT {res['long_ttft_s']:7.3f} s, "
                    f"worst gap {res['itl_max_s'] * 1e3:8.1f} ms, "
                    f"P99 {res['itl_p99_s'] * 1e3:7.1f} ms, median {res['itl_median_s'] * 1e3:6.1f} ms")
    ctx.record["stall"] = [{**row, "n": len(row["runs"])} for row in rows.values() if row["runs"]]


def _label(budget: int | None) -> str:
    return "monolithic" if budget is None else f"chunked-{budget}"


def capstone_run(ctx, name: str, kv_dtype: str, backend: str | None = None) -> dict:
    """``capstone_users`` prompts at once under chunked prefill, the pool in ``kv_dtype`` (``backend``: None
    for the run's serving backend): one run's numbers."""
    c, dev = ctx.config, ctx.device
    U, P, budget = c.capstone_users, c.capstone_prompt, c.capstone_token_budget
    out = blocks_for_tokens(U * P, max(1, budget - U)) + 1 + c.stall_tail_steps + 8  # the first still decodes
    blocks = U * blocks_for_tokens(P + out, c.block_size) + U
    pool_kv = None if kv_dtype == c.dtype else kv_dtype  # the model's own dtype: a plain pool
    ctx.free_memory()  # the earlier sections' caches: this pool is the largest allocation of the run
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    engine, backend = _engine(ctx, name, ChunkedPrefillScheduler(token_budget=budget, max_num_seqs=max(U, 1)),
                              blocks, P + out, pool_kv, backend)
    t0 = time.perf_counter()
    users = [engine.add_request(_prompt(ctx, P, 5000 + i), out) for i in range(U)]
    _step_until(ctx, engine, lambda: all(s.is_finished for s in users))
    wall = time.perf_counter() - t0
    ttft, itl = [s.ttft_s for s in users], [g for s in users for g in s.itl_s]
    decodes = [r.num_decode_tokens for r in engine.history]
    cache = engine.executor.cache
    return {"users": U, "prompt": P, "out_tokens": out, "kv_dtype": kv_dtype, "attention_backend": backend,
            "n": 1, "token_budget": budget, "pool_blocks": blocks, "pool_bytes": cache.nbytes,
            "bytes_per_block": cache.nbytes // blocks,
            "peak_resident": max(decodes), "full_batch_decode_steps": sum(d == U for d in decodes),
            "peak_used_blocks": max(r.num_used_blocks for r in engine.history),
            "preemptions": engine.counters.num_preemptions,
            "gpu_mem_peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
            "ttft_median_s": statistics.median(ttft), "ttft_p90_s": percentile(ttft, 90),
            "ttft_max_s": max(ttft), "itl_median_s": statistics.median(itl), "itl_p99_s": percentile(itl, 99),
            "itl_max_s": max(itl), "steps": len(engine.history), "wall_s": wall}


def capstone(ctx, name: str) -> None:
    """The capstone's users resident at once, once per KV dtype (n = 1 each: a long run). Where the pools ran
    on different attention backends (fused for the model's dtype, reference for a quantized pool, which fused
    cannot read), the model's dtype runs once more on the reference backend, last: the pair that differs in
    the KV dtype alone (the cap may skip it; the skip is recorded)."""
    rows = [_capstone_point(ctx, name, kv) for kv in ctx.config.capstone_kv_dtypes]  # this model's runs only
    ran = {r["attention_backend"] for r in rows if r is not None}
    if len(ran) > 1 and ctx.config.dtype in ctx.config.capstone_kv_dtypes:
        _capstone_point(ctx, name, ctx.config.dtype, "reference")


def _capstone_point(ctx, name: str, kv: str, backend: str | None = None) -> dict | None:
    """One capstone run, appended to the record and logged: its row (None: skipped or failed)."""
    what = (f"{name} capstone {ctx.config.capstone_users} users kv {kv}"
            + (f" on {backend}" if backend else ""))
    if (row := ctx.point(what, lambda: capstone_run(ctx, name, kv, backend))) is None:
        return None
    ctx.record.setdefault("capstone", []).append(row)
    mem = "" if row["gpu_mem_peak_gib"] is None else f", peak {row['gpu_mem_peak_gib']:.1f} GiB"
    ctx.log(f"  {what:<40}: {row['wall_s']:6.1f} s, TTFT median {row['ttft_median_s']:.2f} s, "
            f"peak resident {row['peak_resident']}/{row['users']}{mem} ({row['attention_backend']})")
    return row
