"""The GPU suite's serving sections: the course's central experiments run through the engine itself
(``Engine`` + ``TorchExecutor`` + ``WallClock``, random-weight Llama-3-8B), each run a point of ``run.point``.

- ``stall``: ``stall_decoders`` requests are decoding when one long prompt arrives; monolithic prefill against
  chunked prefill at each budget; per run, every decoder's inter-token gaps from its last token before the
  arrival to ``stall_tail_steps`` steps after the long prompt's first token (median, P99, max over all of
  them) and the long prompt's TTFT. One untimed warm-up run per scheduler (the shortest long prompt), then
  ``stall_repeats`` rounds over every cell (a round visits each cell once: a time cap leaves every cell with
  fewer runs, never some cells with none); each row keeps its runs, so ``n`` and the spread are in the record.
- ``capstone``: ``capstone_users`` prompts arrive at once (fewer where the card's memory says so: the
  preflight), outputs long enough that every user decodes at once (``peak_resident`` checks it); per KV dtype
  ``capstone_repeats`` runs in rounds: pool blocks and bytes, peak GPU memory, TTFT and ITL.
- ``prefill_engine``: one long prompt prefilled through the engine in chunks of each of
  ``engine_prefill_chunks`` and whole, its blocks scattered over the pool as churn leaves them (so a chunk
  after a prefix gathers its keys, as in serving): the chunked rate against the whole-prompt rate.

Each section builds one executor per pool (sized for its largest run) and gives every run a fresh engine over
it: decode CUDA graphs (``longctx.engine.cuda_graphs``, ``cuda_graphs="auto"``) are captured once, before the
timed runs, and a run's sequences are aborted at its end. Timed runs start after ``gc.collect()`` with the
garbage collector off.

An engine run checks the section's deadline every step: past it, the run stops (``OverCap``) and the point
is listed under ``skipped``.
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time

import torch

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, WallClock, percentile
from longctx.engine.cuda_graphs import attach_decode_graphs, graph_buckets
from longctx.engine.torch_executor import TorchExecutor
from longctx.gpu.preflight import (
    capstone_output_tokens,
    capstone_pool_tokens,
    stall_output_tokens,
    stall_pool_tokens,
)
from longctx.kv.block_manager import BlockManager
from longctx.memory import blocks_for_tokens


class OverCap(Exception):
    """An engine run passed its section's deadline and was stopped (``Run.point`` lists it as skipped)."""


def executor_for(ctx, name: str, num_blocks: int, kv_dtype: str | None = None, backend: str | None = None,
                 graph_rows: int = 1) -> TorchExecutor:
    """An executor over a pool of ``num_blocks`` with ``backend`` or the run's serving backend (``fused``
    asked for with a quantized pool, which it cannot read, becomes ``auto``: rows name what ran), decode
    graphs attached as ``cuda_graphs`` says and captured for every bucket up to ``graph_rows`` decodes; what
    was decided is ``executor.graphs_decision`` (a failed capture is also listed under ``fallbacks``)."""
    model, bs = ctx.model(name), ctx.config.block_size
    backend = backend or ctx.config.serving_backend
    if kv_dtype is not None and backend == "fused":
        backend = "auto"
    executor = TorchExecutor(model, BlockManager(num_blocks, bs), kv_dtype=kv_dtype,
                             attention_backend=backend)
    executor.graphs_decision = attach_decode_graphs(
        executor, ctx.config.cuda_graphs if graph_rows > 0 else "off", max_batch=max(graph_rows, 1))
    if executor.decode_graphs is not None:
        executor.decode_graphs.warm(graph_buckets(graph_rows))
        if (failure := executor.decode_graphs.failure) is not None:
            ctx.fallback(f"cuda graphs: {failure}; eager decode steps instead")
    return executor


def _engine(executor: TorchExecutor, scheduler, max_model_len: int) -> Engine:
    return Engine(executor, scheduler, clock=WallClock(), max_model_len=max_model_len, eos_token_id=-1)


def _graphs(executor: TorchExecutor) -> dict:
    """The row's ``cuda_graphs``: what was decided, and what ran so far (replays, eager steps, captures)."""
    g = executor.decode_graphs
    return {"decision": executor.graphs_decision, **({} if g is None else g.describe())}


@contextlib.contextmanager
def timed_window():
    """A timed run: the young garbage collected before, the collector off inside (a full collection of
    torch's heap takes about a second on a busy CPU: the run's sections do one between them)."""
    gc.collect(1)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _end(engine: Engine) -> None:
    """Abort what is still running (the pool is reused by the next run)."""
    for seq in list(engine.pending) + list(engine.waiting) + list(engine.running):
        engine.abort(seq.seq_id)


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


def stall_run(ctx, name: str, long_prompt: int, budget: int | None, seed: int = 0,
              executor: TorchExecutor | None = None) -> dict:
    """One run of the stall scenario: D decoders past their ``stall_arrival_after``-th token, then the long
    prompt (one output token: its TTFT) arrives; returns the run's numbers. ``executor``: the section's (None:
    a fresh one sized for this run)."""
    c = ctx.config
    D, tail = c.stall_decoders, c.stall_tail_steps
    out = stall_output_tokens(c, long_prompt, budget)
    if executor is None:
        executor = executor_for(ctx, name, stall_pool_tokens(c, long_prompt) // c.block_size,
                                graph_rows=D)
    engine = _engine(executor, _scheduler(budget), max(long_prompt, c.stall_decoder_prompt) + out)
    backend = executor.attention_backend_choice.name
    with timed_window():
        t0 = time.perf_counter()
        decoders = [engine.add_request(_prompt(ctx, c.stall_decoder_prompt, seed * 1000 + i), out)
                    for i in range(D)]
        try:
            _step_until(ctx, engine,
                        lambda: all(len(s.token_times_s) >= c.stall_arrival_after for s in decoders))
            steady = statistics.median(g for s in decoders for g in s.itl_s)
            first = [len(s.token_times_s) - 1 for s in decoders]
            n_steps = len(engine.history)
            long_req = engine.add_request(_prompt(ctx, long_prompt, seed * 1000 + 999), 1)
            _step_until(ctx, engine, lambda: bool(long_req.token_times_s))
            end = len(engine.history) + tail
            _step_until(ctx, engine, lambda: len(engine.history) >= end)
            wall = time.perf_counter() - t0
        finally:
            _end(engine)
    per = [[b - a for a, b in zip(s.token_times_s[i:], s.token_times_s[i + 1:], strict=False)]
           for s, i in zip(decoders, first, strict=True)]  # each decoder's gaps after the arrival
    gaps, worst = [g for p in per for g in p], [max(p) for p in per]
    steps = engine.history[n_steps:]
    if any(s.finish_reason not in (None, "abort") for s in decoders):
        raise RuntimeError("a decoder finished inside the window: its gaps would be missing "
                           "(output too short)")
    return {"attention_backend": backend, "long_ttft_s": long_req.ttft_s,
            "itl_median_s": statistics.median(gaps), "itl_p99_s": percentile(gaps, 99),
            "itl_max_s": max(gaps), "decoder_gaps_after_arrival": len(gaps),
            "decoder_worst_gap_min_s": min(worst), "decoder_worst_gap_median_s": statistics.median(worst),
            "steady_itl_s": steady, "max_step_s": max(r.duration_s for r in steps), "steps": len(steps),
            "wall_s": wall}


def stall(ctx, name: str) -> None:
    """Monolithic against chunked prefill at each budget, for each long prompt: rows with their runs, over
    one executor (its graphs captured once, before the warm-up runs)."""
    c = ctx.config
    budgets = (None, *c.stall_budgets)
    rows = {(L, b): {"long_prompt": L, "scheduler": "monolithic" if b is None else "chunked",
                     "token_budget": b, "decoders": c.stall_decoders,
                     "decoder_prompt": c.stall_decoder_prompt, "runs": []}
            for L in c.stall_long_prompts for b in budgets}
    executor = ctx.point(f"{name} stall executor", timed=False, fn=lambda: executor_for(
        ctx, name, max(stall_pool_tokens(c, L) for L in c.stall_long_prompts) // c.block_size,
        graph_rows=c.stall_decoders))
    if executor is None:
        return
    # warm-up: one untimed run per scheduler at the shortest long prompt (kernels, compiles)
    for b in budgets:
        ctx.point(f"{name} stall warm-up {_label(b)}",
                  lambda b=b: stall_run(ctx, name, min(c.stall_long_prompts), b, executor=executor))
    for rep in range(c.stall_repeats):
        for (L, b), row in rows.items():
            what = f"{name} stall {L} {_label(b)} run {rep + 1}"
            if (res := ctx.point(what, lambda L=L, b=b, rep=rep:
                                 stall_run(ctx, name, L, b, seed=rep + 1, executor=executor))) is None:
                continue
            row["attention_backend"] = res.pop("attention_backend")
            row["runs"].append(res)
            ctx.log(f"  {what:<40}: TTFT {res['long_ttft_s']:7.3f} s, "
                    f"worst gap {res['itl_max_s'] * 1e3:8.1f} ms, "
                    f"P99 {res['itl_p99_s'] * 1e3:7.1f} ms, median {res['itl_median_s'] * 1e3:6.1f} ms")
    graphs = _graphs(executor)
    ctx.record["stall"] = [{**row, "n": len(row["runs"]), "cuda_graphs": graphs}
                           for row in rows.values() if row["runs"]]


def _label(budget: int | None) -> str:
    return "monolithic" if budget is None else f"chunked-{budget}"


def capstone_run(ctx, name: str, kv_dtype: str, backend: str | None = None,
                 executor: TorchExecutor | None = None) -> dict:
    """``capstone_users_for(kv_dtype)`` prompts at once under chunked prefill, the pool in ``kv_dtype``
    (``backend``: None for the run's serving backend; ``executor``: the dtype's, None for a fresh one): one
    run's numbers."""
    c, dev = ctx.config, ctx.device
    U, P, budget = c.capstone_users_for(kv_dtype), c.capstone_prompt, c.capstone_token_budget
    out = capstone_output_tokens(c, U)
    if executor is None:
        executor = _capstone_executor(ctx, name, kv_dtype, backend, U)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    engine = _engine(executor, ChunkedPrefillScheduler(token_budget=budget, max_num_seqs=max(U, 1)), P + out)
    with timed_window():
        t0 = time.perf_counter()
        users = [engine.add_request(_prompt(ctx, P, 5000 + i), out) for i in range(U)]
        try:
            _step_until(ctx, engine, lambda: all(s.is_finished for s in users))
        finally:
            _end(engine)
        wall = time.perf_counter() - t0
    ttft, itl = [s.ttft_s for s in users], [g for s in users for g in s.itl_s]
    decodes = [r.num_decode_tokens for r in engine.history]
    cache, blocks = executor.cache, executor.block_manager.num_blocks
    return {"users": U, "prompt": P, "out_tokens": out, "kv_dtype": kv_dtype,
            "attention_backend": executor.attention_backend_choice.name, "n": 1, "token_budget": budget,
            "pool_blocks": blocks, "pool_bytes": cache.nbytes, "bytes_per_block": cache.nbytes // blocks,
            "peak_resident": max(decodes), "full_batch_decode_steps": sum(d == U for d in decodes),
            "peak_used_blocks": max(r.num_used_blocks for r in engine.history),
            "preemptions": engine.counters.num_preemptions,
            "gpu_mem_peak_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
            "ttft_median_s": statistics.median(ttft), "ttft_p90_s": percentile(ttft, 90),
            "ttft_max_s": max(ttft), "itl_median_s": statistics.median(itl), "itl_p99_s": percentile(itl, 99),
            "itl_max_s": max(itl), "steps": len(engine.history), "wall_s": wall}


def _capstone_executor(ctx, name: str, kv_dtype: str, backend: str | None, users: int) -> TorchExecutor:
    c = ctx.config
    pool_kv = None if kv_dtype == c.dtype else kv_dtype  # the model's own dtype: a plain pool
    return executor_for(ctx, name, capstone_pool_tokens(c, users) // c.block_size, pool_kv, backend,
                        graph_rows=users)


def capstone(ctx, name: str) -> None:
    """The capstone's users resident at once, per KV dtype ``capstone_repeats`` runs in rounds over the
    dtypes (one executor per dtype at a time: the pools are the run's largest allocations). Where the pools
    ran on different attention backends (fused for the model's dtype, reference for a quantized pool, which
    fused cannot read), the model's dtype runs once more on the reference backend, last: the pair that
    differs in the KV dtype alone (the cap may skip it; the skip is recorded)."""
    c = ctx.config
    cells = [(kv, None) for kv in c.capstone_kv_dtypes]
    rows: dict = {}
    for rep in range(c.capstone_repeats):
        for kv, backend in cells:
            _capstone_point(ctx, name, kv, backend, rep, rows)
        if rep == 0:
            ran = {r["attention_backend"] for r in rows.values()}
            if len(ran) > 1 and c.dtype in c.capstone_kv_dtypes:
                cells.append((c.dtype, "reference"))
                _capstone_point(ctx, name, c.dtype, "reference", rep, rows)
    ctx.record["capstone"] = list(rows.values())


_CAPSTONE_MEDIANS = ("ttft_median_s", "ttft_p90_s", "ttft_max_s", "itl_median_s", "itl_p99_s", "itl_max_s",
                     "wall_s")


def _capstone_point(ctx, name: str, kv: str, backend: str | None, rep: int, rows: dict) -> None:
    """One capstone run (its own executor, freed after), folded into its row: the first run's pool and
    counts, the medians over runs of TTFT, ITL and wall time, the peaks' maxima, each run under ``runs``."""
    users = ctx.config.capstone_users_for(kv)
    what = (f"{name} capstone {users} users kv {kv}" + (f" on {backend}" if backend else "")
            + f" run {rep + 1}")

    def one():
        executor = _capstone_executor(ctx, name, kv, backend, users)
        try:
            res = capstone_run(ctx, name, kv, backend, executor=executor)
            res["cuda_graphs"] = _graphs(executor)
            return res
        finally:
            executor.decode_graphs = None
            del executor
            ctx.free_memory()

    if (res := ctx.point(what, one)) is None:
        return
    key = (kv, backend)
    row = rows.setdefault(key, {**res, "runs": []})
    row["runs"].append({k: res[k] for k in (*_CAPSTONE_MEDIANS, "peak_resident", "gpu_mem_peak_gib")})
    row["n"] = len(row["runs"])
    for k in _CAPSTONE_MEDIANS:  # each a median over runs (a run's P90 <= its max: so are the medians)
        row[k] = statistics.median(r[k] for r in row["runs"])
    row["peak_resident"] = max(r["peak_resident"] for r in row["runs"])
    if res["gpu_mem_peak_gib"] is not None:
        row["gpu_mem_peak_gib"] = max(r["gpu_mem_peak_gib"] for r in row["runs"])
    mem = "" if res["gpu_mem_peak_gib"] is None else f", peak {res['gpu_mem_peak_gib']:.1f} GiB"
    ctx.log(f"  {what:<40}: {res['wall_s']:6.1f} s, TTFT median {res['ttft_median_s']:.2f} s, "
            f"peak resident {res['peak_resident']}/{res['users']}{mem} ({res['attention_backend']})")


def _scattered_pool(executor: TorchExecutor, seed: int) -> None:
    """Leave the pool's free blocks in a random order, as churn does: take every free block as a one-block
    sequence, then free them shuffled (public calls only)."""
    bm, ids = executor.block_manager, []
    for i in range(bm.num_free_blocks):
        bm.allocate(-2 - i, 1)
        ids.append(-2 - i)
    random.Random(seed).shuffle(ids)
    for sid in ids:
        bm.free(sid)


def prefill_engine_run(ctx, name: str, executor: TorchExecutor, chunk: int | None, seed: int) -> dict:
    """The long prompt alone through the engine, chunked by ``chunk`` (None: whole), one output token:
    seconds to its first token and the steps it took."""
    T = ctx.config.prefill_prompt_tokens
    scheduler = MonolithicScheduler() if chunk is None else ChunkedPrefillScheduler(token_budget=chunk)
    engine = _engine(executor, scheduler, T + 1)
    _scattered_pool(executor, seed)
    with timed_window():
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        t0 = time.perf_counter()
        req = engine.add_request(_prompt(ctx, T, 7000 + seed), 1)
        try:
            _step_until(ctx, engine, lambda: req.is_finished)
        finally:
            _end(engine)
        wall = time.perf_counter() - t0
    return {"time_s": wall, "steps": len(engine.history)}


def prefill_engine(ctx, name: str) -> None:
    """One ``prefill_prompt_tokens`` prompt through the engine whole and in chunks of each
    ``engine_prefill_chunks`` over a scattered pool: median seconds of ``repeats`` runs after a warm-up run
    each, and the chunked rate as a share of the whole-prompt rate."""
    c = ctx.config
    T = c.prefill_prompt_tokens
    cells = [None, *(k for k in c.engine_prefill_chunks if k < T)]
    executor = ctx.point(f"{name} engine prefill executor", timed=False, fn=lambda: executor_for(
        ctx, name, blocks_for_tokens(T + 1, c.block_size) + 2, graph_rows=0))  # no decode steps
    if executor is None:
        return
    flops = ctx.cost(ctx.model(name).config, [(T, 0)]).flops
    whole = None
    for chunk in cells:
        what = f"{name} engine prefill {T} " + ("whole" if chunk is None else f"chunk {chunk}")

        def measure(chunk=chunk):
            prefill_engine_run(ctx, name, executor, chunk, seed=0)  # warm-up
            return [prefill_engine_run(ctx, name, executor, chunk, seed=i + 1) for i in range(c.repeats)]

        if (runs := ctx.point(what, measure)) is None:
            continue
        t = statistics.median(r["time_s"] for r in runs)
        whole = t if chunk is None else whole
        row = {"model": name, "attention_backend": executor.attention_backend_choice.name,
               "chunk_size": chunk or T, "prompt_tokens": T, "scattered": True, "time_s": t,
               "min_s": min(r["time_s"] for r in runs), "max_s": max(r["time_s"] for r in runs),
               "n": len(runs), "steps": runs[0]["steps"], "flops": flops, "flops_per_s": flops / t,
               "share_of_whole_rate": None if whole is None else whole / t}
        ctx.record.setdefault("prefill_engine", []).append(row)
        share = "" if whole is None or chunk is None else f", {whole / t:.0%} of the whole-prompt rate"
        ctx.log(f"  {what:<40}: {t * 1e3:9.2f} ms ({min(r['time_s'] for r in runs) * 1e3:.2f}-"
                f"{max(r['time_s'] for r in runs) * 1e3:.2f}), {row['steps']} steps{share}")
