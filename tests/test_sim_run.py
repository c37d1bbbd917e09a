"""The simulator's run loop: deterministic, metrics as vLLM defines them, KV limits and preemption."""

import json
import statistics

import pytest

from longctx.engine import SLO, ChunkedPrefillScheduler, MonolithicScheduler
from longctx.lessons.stall import exercise1, exercise1_compare
from longctx.sim import kv_pool_blocks, make_workload, simulate
from longctx.sim.scenarios import capacity, run_rate


def _run(seed=0, **kw):
    wl = make_workload(60, 10.0, 512, 32, seed=seed)
    return simulate(wl, ChunkedPrefillScheduler(256), "llama-3-8b", "h100", **kw)


def test_same_seed_identical_json():
    a, b = _run(3).to_dict(), _run(3).to_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.dumps(_run(4).to_dict()) != json.dumps(a)


def test_result_keys_and_consistency():
    r = _run(slo=SLO(ttft_s=10.0))
    d = r.to_dict()
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(d[key]) >= {"p50", "p90", "p95", "p99"}
        assert d[key]["p50"] <= d[key]["p90"] <= d[key]["p95"] <= d[key]["p99"]
    assert d["completed"] == 60 and d["goodput_req_s"] == pytest.approx(d["request_throughput_req_s"])
    assert d["throughput_tok_s"] == pytest.approx(60 * 32 / d["duration_s"])
    # steps are back to back or idle gaps, never overlapping
    for s, t in zip(r.steps, r.steps[1:], strict=False):
        assert t.start_s >= s.end_s - 1e-12


def test_kv_pool_from_gpu_memory():
    # (0.9 * 80e9 - 8.03e9 * 2) / (16 * 131072) for Llama-3-8B bf16 on an H100
    assert kv_pool_blocks("llama-3-8b", "h100") == int((0.9 * 80e9 - 2 * 8_030_261_248) // (16 * 131072))
    with pytest.raises(ValueError, match="no room"):
        kv_pool_blocks("llama-3.1-70b", "h100")


def test_small_pool_preempts_and_still_finishes():
    wl = make_workload(40, float("inf"), 400, 200, seed=0)
    r = simulate(wl, ChunkedPrefillScheduler(512), "llama-3-8b", "h100", num_blocks=120)
    assert r.metrics.completed == 40 and r.num_preemptions > 0


def test_chunking_bounds_the_decode_stall():
    mono, chunk = exercise1(MonolithicScheduler()), exercise1(ChunkedPrefillScheduler(512))
    # Monolithic: a stream's gap covers the whole 12K prefill; chunked: about one 512-token step.
    assert mono.max_itl_s > 0.2 and mono.max_itl_s > 10 * mono.steady_itl_s
    assert chunk.max_itl_s < 0.05 and chunk.long_prompt_ttft_s >= mono.long_prompt_ttft_s
    assert len(mono.stream_token_times_s) == 16 and mono.steps


def test_exercise1_compare_budgets_order():
    res = exercise1_compare(budgets=(512, 2048))
    assert list(res) == ["monolithic", "chunked-512", "chunked-2048"]
    assert res["chunked-512"].max_itl_s < res["chunked-2048"].max_itl_s < res["monolithic"].max_itl_s


def test_chunked_prefill_meets_a_strict_itl_slo_that_monolithic_misses():
    mono = run_rate(lambda: MonolithicScheduler(8192), 4.0, num_requests=60)
    chunk = run_rate(lambda: ChunkedPrefillScheduler(512), 4.0, num_requests=60)
    assert not mono.meets(0.1) and chunk.meets(0.1)
    assert chunk.p99_itl_s < 0.05 < 0.1 < mono.p99_itl_s


def test_capacity_search_brackets_the_answer():
    cache = {}
    cap = capacity(lambda: ChunkedPrefillScheduler(512), 0.1, low_qps=1.0, high_qps=64.0, iterations=2,
                   max_delay_s=0.2, num_requests=40, cache=cache)
    assert 1.0 <= cap < 64.0
    passing = [r for r, p in cache.items() if p.meets(0.1, 0.2)]
    failing = [r for r, p in cache.items() if not p.meets(0.1, 0.2)]
    assert cap == max(r for r in passing if r < min(failing))


def test_recorded_capacity_and_live_curve():
    from longctx.sim.scenarios import load_recorded, p99_itl_curve

    rec = load_recorded()
    assert {"model", "scheduler", "slo_p99_itl_s", "capacity_qps"} <= set(rec["rows"][0])
    seeds = rec["workload"]["seeds"]
    assert len(seeds) >= 5 and seeds[0] == rec["workload"]["seed"] == 0
    for row in rec["rows"]:  # seed 0's capacity, every seed's beside it, and their median
        assert (
            len(row["capacity_qps_by_seed"]) == len(seeds)
            and row["capacity_qps"] == row["capacity_qps_by_seed"][0]
        )
        assert row["capacity_qps_median"] == pytest.approx(statistics.median(row["capacity_qps_by_seed"]))
    with pytest.raises(ValueError, match="no recorded result"):
        load_recorded("sim_nothing.json")
    curve = p99_itl_curve(rates_qps=(2.0,), num_requests=20)
    assert list(curve) == ["monolithic", "chunked-512"] and curve["monolithic"][0].rate_qps == 2.0


def test_modelled_kv_pruning_frees_blocks_and_fits_more_sequences():
    """A pool that holds ~4 requests at once holds ~twice as many when half of each prompt is evicted."""
    from longctx.engine import ChunkedPrefillScheduler
    from longctx.sim import simulate
    from longctx.sim.workload import Request

    work = [Request(arrival_s=0.0, prompt_tokens=4096, output_tokens=64) for _ in range(16)]
    runs = {r: simulate(work, ChunkedPrefillScheduler(2048), "llama-3-8b", "h100", num_blocks=4 * 260,
                        kv_compression_ratio=r) for r in (0.0, 0.5)}
    busiest = {r: max(len(set(s.seq_ids)) for s in res.steps) for r, res in runs.items()}
    assert busiest[0.5] > 1.5 * busiest[0.0]
    assert runs[0.5].metrics.duration_s < runs[0.0].metrics.duration_s
    assert runs[0.5].config["kv_compression_ratio"] == 0.5
    import pytest

    with pytest.raises(ValueError, match=r"kv_compression_ratio must be in \[0, 1\)"):
        simulate(work, ChunkedPrefillScheduler(2048), kv_compression_ratio=1.0)


# ---- KV formats, pool_gib, prefix caching ----

def _users(n, prompt=1008, output=16):
    from longctx.sim.workload import Request

    return [Request(arrival_s=0.0, prompt_tokens=prompt, output_tokens=output) for _ in range(n)]


@pytest.mark.parametrize("kv_dtype", ["fp8", "int4", "bf16"])
def test_pool_gib_blocks_equal_the_planner(kv_dtype):
    from longctx.kv.quant import pool_bytes_per_token
    from longctx.plan import plan
    from longctx.sim.run import build_sim_engine

    want = plan("llama-3-8b", kv_dtype, 64, 8192, 2048, pool_gib=48).pool_blocks
    r = simulate(
        _users(2), ChunkedPrefillScheduler(512), "llama-3-8b", "h100", pool_gib=48, kv_dtype=kv_dtype
    )
    assert r.config["num_blocks"] == want and r.config["kv_dtype"] == kv_dtype
    assert r.config["pool_bytes_per_token"] == pool_bytes_per_token("llama-3-8b", kv_dtype)
    eng = build_sim_engine(ChunkedPrefillScheduler(512), "llama-3-8b", "h100", pool_gib=48, kv_dtype=kv_dtype)
    assert eng.block_manager.num_blocks == want
    if kv_dtype == "fp8":
        assert want == 48_395  # longctx.plan's capstone
    with pytest.raises(ValueError, match="not both"):
        simulate(_users(2), ChunkedPrefillScheduler(512), num_blocks=100, pool_gib=48)
    with pytest.raises(ValueError, match="pool_gib must be"):
        simulate(_users(2), ChunkedPrefillScheduler(512), pool_gib=-1)


def test_kv_pool_counts_quantization_scales():
    from longctx.kv.quant import pool_bytes_per_token
    from longctx.memory import kv_bytes_per_token

    bf16, fp8 = (kv_pool_blocks("llama-3-8b", "h100", kv_dtype=d) for d in ("bf16", "fp8"))
    free = 0.9 * 80e9 - 2 * 8_030_261_248
    assert fp8 == int(free // (16 * pool_bytes_per_token("llama-3-8b", "fp8")))  # 66,560 B, not 65,536
    assert fp8 < int(free // (16 * kv_bytes_per_token("llama-3-8b", "fp8")))
    assert 1.9 * bf16 < fp8 < 2 * bf16
    # the same 48 GiB holds ~2x the fp8 blocks, and the cost model moves the pool's bytes
    a, b = (
        simulate(_users(2), ChunkedPrefillScheduler(512), pool_gib=48, kv_dtype=d) for d in ("bf16", "fp8")
    )
    assert 1.9 * a.config["num_blocks"] < b.config["num_blocks"] < 2 * a.config["num_blocks"]
    from longctx.sim.cost_model import CostModelExecutor

    for d in ("bf16", "fp16", "fp32", "fp8", "int8", "int4"):
        assert CostModelExecutor("llama-3-8b", "h100", kv_dtype=d).kv_bytes_per_token == pool_bytes_per_token(
            "llama-3-8b", d)
    assert pool_bytes_per_token("llama-3-8b", "bf16") == kv_bytes_per_token("llama-3-8b", "bf16")


def test_kv_dtype_reaches_the_cost_model():
    """simulate passes kv_dtype on: fp8 KV reads half the bytes, so long-context decodes are faster."""
    work = _users(16, prompt=4000, output=64)
    a, b = (
        simulate(work, ChunkedPrefillScheduler(512), num_blocks=8000, kv_dtype=d) for d in ("bf16", "fp8")
    )
    assert b.metrics.tpot.median < a.metrics.tpot.median


def test_prefix_caching_skips_the_shared_prefix():
    work = _users(8, prompt=4000, output=16)
    kw = dict(model="llama-3-8b", hardware="h100", num_blocks=4000)
    plain = simulate(work, ChunkedPrefillScheduler(512), shared_prefix_tokens=2048, **kw)
    cached = simulate(
        work, ChunkedPrefillScheduler(512), prefix_caching=True, shared_prefix_tokens=2048, **kw
    )
    assert plain.num_preemptions == cached.num_preemptions == 0
    assert plain.prefix_hit_tokens == 0 and plain.prefill_tokens == 8 * 4000
    assert cached.config["prefix_caching"] and cached.config["shared_prefix_tokens"] == 2048
    assert cached.prefix_hit_tokens == 7 * 2048  # the first request computes the prefix, the others hit it
    assert cached.prefill_tokens == plain.prefill_tokens - cached.prefix_hit_tokens
    d = cached.to_dict()
    assert d["prefix_hit_tokens"] == 7 * 2048 and d["prefill_tokens"] == cached.prefill_tokens
    assert d["num_evictions"] == 0 and 0 < d["peak_used_blocks"] <= 4000
    assert cached.peak_used_blocks < plain.peak_used_blocks  # the prefix's blocks are shared
    assert cached.metrics.ttft.median < plain.metrics.ttft.median


def test_prefix_hits_per_sequence_and_partial_prefix_block():
    from longctx.sim.run import build_sim_engine, sim_prompt_ids

    eng = build_sim_engine(ChunkedPrefillScheduler(512), "llama-3-8b", "h100", num_blocks=3000,
                           prefix_caching=True)
    assert eng.block_manager.enable_prefix_caching
    seqs = [eng.add_request(sim_prompt_ids(i, 3000, 2050), 8) for i in range(4)]
    eng.run_until_done()
    # only full blocks are shared: 2,050 shared tokens -> 128 blocks = 2,048 tokens
    assert [s.num_prefix_cached_tokens for s in seqs] == [0, 2048, 2048, 2048]
    eng.block_manager.check_invariants()
    assert sim_prompt_ids(2, 5, 3) == [1, 2, 3, -3, -3]
    with pytest.raises(ValueError, match="longer than request 0's prompt"):
        simulate(_users(2, prompt=100), ChunkedPrefillScheduler(512), shared_prefix_tokens=101)
    with pytest.raises(ValueError, match="shared_prefix_tokens must be"):
        simulate(_users(2), ChunkedPrefillScheduler(512), shared_prefix_tokens=-1)


def test_no_shared_prefix_no_hits_even_with_prefix_caching():
    r = simulate(_users(6), ChunkedPrefillScheduler(512), num_blocks=2000, prefix_caching=True)
    assert r.prefix_hit_tokens == 0 and r.prefill_tokens == 6 * 1008


def test_prefix_caching_refuses_kv_compression():
    with pytest.raises(ValueError, match="prefix_caching cannot be combined with kv_compression_ratio"):
        simulate(_users(2), ChunkedPrefillScheduler(512), prefix_caching=True, kv_compression_ratio=0.5)


def test_prefix_caching_evicts_under_pressure_and_finishes():
    work = _users(24, prompt=2000, output=64)
    r = simulate(work, ChunkedPrefillScheduler(1024), num_blocks=700, prefix_caching=True,
                 shared_prefix_tokens=1024)
    assert r.metrics.completed == 24 and r.num_evictions > 0 and r.prefix_hit_tokens > 0


def test_capstone_scale_runs_in_seconds():
    """64 users x 8K tokens, fp8, 2K shared prefix, 48 GiB: hashing per block keeps it fast."""
    work = _users(64, prompt=7936, output=256)
    r = simulate(work, ChunkedPrefillScheduler(512), "llama-3-8b", "h100", pool_gib=48, kv_dtype="fp8",
                 prefix_caching=True, shared_prefix_tokens=2048)
    assert r.metrics.completed == 64 and r.prefix_hit_tokens == 63 * 2048
    assert r.wall_s < 15


def test_simulate_pauses_the_cycle_collector_and_restores_it():
    import gc

    from longctx.engine import ChunkedPrefillScheduler
    from longctx.sim import make_workload, simulate
    from longctx.sim.run import collector_paused

    wl = make_workload(5, 20.0, 64, 4, seed=1)
    was_on = gc.isenabled()
    try:
        for state in (True, False):
            gc.enable() if state else gc.disable()
            simulate(wl, ChunkedPrefillScheduler(64))
            assert gc.isenabled() is state
        gc.enable()
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
    finally:
        gc.enable() if was_on else gc.disable()


def test_a_scaled_executor_stretches_every_step_and_nothing_else():
    """ScaledExecutor (sim_fidelity's conditioning intervention): the same schedule, every step `scale` times
    as long; the wrapped cost model's pool is the engine's; a bad scale or a non-executor is refused."""
    from longctx.engine import Engine, VirtualClock
    from longctx.sim import CostModelExecutor, ScaledExecutor

    def run(executor):
        engine = Engine(
            executor, ChunkedPrefillScheduler(64), num_blocks=64, block_size=16, clock=VirtualClock(),
            max_model_len=1024,
        )
        for i in range(3):
            # all at once: the schedule cannot drift
            engine.add_request([0] * (40 + 30 * i), 5, arrival_s=0.0)
        engine.run_until_done()
        return engine.history

    base = CostModelExecutor("llama-3-8b", "h100")
    plain, slow = run(base), run(ScaledExecutor(CostModelExecutor("llama-3-8b", "h100"), 2.0))
    assert [s.seq_ids for s in plain] == [s.seq_ids for s in slow]
    assert [s.duration_s * 2 for s in plain] == pytest.approx([s.duration_s for s in slow], rel=1e-12)
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        ScaledExecutor(base, 0)
    with pytest.raises(ValueError, match="wraps a longctx.engine.Executor"):
        ScaledExecutor("not an executor", 1.5)


def test_lesson_02_quotes_the_recorded_medians():
    """Lesson 02's capacity prose states the medians over seeds that sim_capacity.json holds."""
    from pathlib import Path

    from longctx.sim.scenarios import load_recorded

    nb = json.loads((Path(__file__).resolve().parents[1] / "solutions" / "02_chunked_prefill"
                     / "02_chunked_prefill.ipynb").read_text())
    prose = " ".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown").replace(
        "\n", " "
    )
    cap = {
        (r["model"], r["slo_p99_itl_s"], r["scheduler"]): r["capacity_qps_median"]
        for r in load_recorded()["rows"]
    }
    budgets = ", ".join(f"{cap['llama-3-8b', 0.1, f'chunked-{b}']:.1f}" for b in (512, 1024))
    assert f"{budgets} and {cap['llama-3-8b', 0.1, 'chunked-2048']:.1f} requests/s" in " ".join(prose.split())
    assert (
        f"Llama-3-8B {cap['llama-3-8b', 0.5, 'monolithic']:.1f} against "
        f"{cap['llama-3-8b', 0.5, 'chunked-512']:.1f}"
        in " ".join(prose.split())
    )
