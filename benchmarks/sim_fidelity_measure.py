"""Measuring for ``benchmarks/sim_fidelity.py`` (its step 1 and the runs, module docstring there): the real
engine on this CPU serving workloads A and B with its steps recorded, the GEMM profile, the speed probes; the
two cost models; saved runs read back (``--from-runs``) and the runs file's JSON form."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import time

import numpy as np
from sim_fidelity_analysis import (
    A_BUDGET,
    B_BUDGET,
    B_RATE,
    B_REQUESTS,
    BLOCK_SIZE,
    METRICS,
    NUM_BLOCKS,
    metric_values,
)

from longctx.engine import ChunkedPrefillScheduler, Engine, WallClock, summarize
from longctx.provenance import wait_for_quiet
from longctx.sim import CostFactors, CostModelExecutor, LogNormal, RecordingExecutor, Uniform, make_workload
from longctx.sim.gemm_profile import GemmProfile, measure_gemm_profile
from longctx.sim.hardware import measure_cpu_hardware, probe_gemm_s
from longctx.sim.recording import MeasuredStep

RECORD_FILE = "sim_fidelity.json"  # the record, in longctx/data/recorded/ (sim_fidelity.RECORD)
RUNS_FILE = "sim_fidelity_runs.json"  # the record's raw measured runs (compact), beside the record
STAIR_REQUESTS, STAIR_START_S, STAIR_GAP_S = 5, 14.0, 1.0  # A's staircase (module docstring)


def run_real(model, workload, scheduler, vocab_size, seed=0):
    """Serve ``workload`` on the real model in real time; returns (finished sequences, recorded steps, the
    engine's own time per step: its scheduling and bookkeeping, which no recorded step holds and the
    simulator's virtual clock does not count; ``HOST_GAP_DEFINITION``)."""
    from longctx.engine import TorchExecutor
    from longctx.kv.block_manager import BlockManager

    rng = np.random.default_rng(seed)
    pool = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
    rec = RecordingExecutor(TorchExecutor(model, pool))
    engine = Engine(rec, scheduler, pool, clock=WallClock(),
                    max_model_len=model.config.max_context, eos_token_id=None)  # no EOS: lengths as asked
    for r in workload:
        ids = rng.integers(100, vocab_size, size=r.prompt_tokens).tolist()
        engine.add_request(ids, r.output_tokens, arrival_s=r.arrival_s)
    engine.clock.reset()  # arrivals are relative to the start of serving
    engine.run_until_done()
    h = engine.history  # HOST_GAP_DEFINITION
    gaps = [b.start_s - a.start_s - a.duration_s for a, b in zip(h, h[1:], strict=False)]
    return engine.finished, rec.steps, float(np.median(gaps)) if gaps else 0.0


PROFILE_ROWS = (*range(1, 17), 24, 32, 48, 64, 128, 256, 384, 512, 640)  # B's steps hold 1 ... 512 tokens
# The engine's own time per step, as run_real measures it; HOST_GAP_S for a measurement saved without it.
HOST_GAP_DEFINITION = "median over A's steps of the next step's start - this step's start - its executor time"
HOST_GAP_S = 1.20e-4
HOST_GAP_MEASURED = "115 steps of workload A (burst and staircase), AMD EPYC VM, 2026-12-04; P90 0.192 ms"
WORKLOAD_A = {
    "burst": 10, "stair": {"requests": STAIR_REQUESTS, "start_s": STAIR_START_S, "gap_s": STAIR_GAP_S},
    "budget": A_BUDGET,
}


def measure(threads: int, repeats: int, force: bool) -> dict:
    """Steps 1-3's measurements on the real engine: this CPU, a GEMM profile and a run of A and of B per
    repeat, the speed probes (what ``--save-runs`` keeps and ``--from-runs`` reads back)."""
    import torch

    from longctx.model.weights import load_model

    torch.set_num_threads(threads)
    model = load_model()
    vocab = model.config.vocab_size
    hw = measure_cpu_hardware()
    print(
        f"CPU ({torch.get_num_threads()} torch threads): {hw.peak_flops_per_s / 1e9:.1f} GFLOP/s fp32 GEMM, "
        f"{hw.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s copy",
        flush=True,
    )
    profiles = []  # step 1: this machine's GEMMs at each row count, once before each repeat (their median)
    # warm-up (first torch calls are slow)
    run_real(model, make_workload(2, float("inf"), 64, 4, seed=99), ChunkedPrefillScheduler(A_BUDGET), vocab)
    wl_a, wl_b = workloads()
    t0, runs_a, real_runs, probes, gaps = time.perf_counter(), [], [], [], []
    for rep in range(repeats):  # A and B alternate: a drift of the machine's speed reaches both alike
        wait_for_quiet(threads, force)
        profiles.append(measure_gemm_profile("smollm2-135m", rows=PROFILE_ROWS, repeats=1))
        probes.append(probe_gemm_s())
        _, steps_a, gap = run_real(model, wl_a, ChunkedPrefillScheduler(A_BUDGET), vocab)
        runs_a.append(steps_a)
        gaps.append(gap)
        load = wait_for_quiet(threads, force)
        probes.append(probe_gemm_s())
        t1 = time.perf_counter()
        real_b, steps_b, _ = run_real(model, wl_b, ChunkedPrefillScheduler(B_BUDGET), vocab, seed=2)
        measured = dict(zip(METRICS, metric_values(summarize(real_b)), strict=True))
        real_runs.append((rep, load, time.perf_counter() - t1, measured, steps_b))
        probes.append(probe_gemm_s())
        print(
            f"repeat {rep}: A then B measured (load {load:.2f} before B, B took {real_runs[-1][2]:.1f} s)",
            flush=True,
        )
    print(f"measured in {time.perf_counter() - t0:.0f} s")
    return {
        "hardware": hw, "profile": GemmProfile.median_of(profiles), "profiles": profiles, "runs_a": runs_a,
        "real_runs": real_runs, "probes": probes, "host_gap_s": float(np.median(gaps)),
        "host_gap_definition": HOST_GAP_DEFINITION, "threads": threads, "workload_a": WORKLOAD_A,
    }


def cost_models(hw, profile):
    """The two cost models step 1 compares, uncalibrated: GEMMs from ``profile``, and on their rooflines. A
    CPU
    runs no GEMM tiles in waves over SMs: the operator form without the H100's tile quantization."""
    return tuple(CostModelExecutor("smollm2-135m", hw, CostFactors(gemm_tile_tokens=1), weight_dtype="fp32",
                                   kv_dtype="fp32", gemm_profile=p) for p in (profile, None))


def load_saved(path: pathlib.Path) -> dict:
    """What ``measure`` returned, from a pickle ``--save-runs`` wrote (only one you made) or from a record's
    runs
    file (``sim_fidelity_runs.json``, with the record beside it: its CPU, median GEMM profile and probes)."""
    if path.suffix != ".json":
        return pickle.loads(path.read_bytes())
    from longctx.specs import HardwareSpec

    runs, rec = json.loads(path.read_text()), json.loads((path.parent / RECORD_FILE).read_text())
    if runs.get("commit") != rec.get("commit"):
        raise SystemExit(
            f"{path} is not the runs of {RECORD_FILE} beside it (commits {runs.get('commit')} and "
            f"{rec.get('commit')})"
        )
    cpu = rec["cpu"]
    saved = {
        "hardware": HardwareSpec(
            "cpu-measured", cpu["peak_flops_per_s"], cpu["bandwidth_bytes_per_s"], 8e9,
            source=f"{RECORD_FILE} (measured on that machine)",
        ),
        "profile": GemmProfile.from_dict(rec["gemm_profile"]),
        "profiles": None,
        "profile_spread": rec["gemm_profile_spread"],
        "runs_a": [steps_from_json(r) for r in runs["a"]],
        "real_runs": [
            (r["repeat"], r["load_1min_start"], r["wall_s"], r["measured_s"], steps_from_json(r["steps"]))
            for r in runs["b"]
        ],
        "probes": rec["speed_probe_s"],
        "threads": cpu["torch_threads"],
        "workload_a": rec.get("workload_a"),
    }
    # a record analysed with the HOST_GAP_S constant stores that constant under the current definition: it
    # was not measured on its runs, and a re-analysis must keep saying so
    constant = str(rec.get("host_gap_source", "")).startswith("HOST_GAP_S")
    if rec.get("host_gap_definition") == HOST_GAP_DEFINITION and not constant:
        saved["host_gap_s"], saved["host_gap_definition"] = rec["host_gap_s"], HOST_GAP_DEFINITION
    if "host_gap_earlier_definition_s" in rec:
        saved["host_gap_earlier_definition_s"] = rec["host_gap_earlier_definition_s"]
    # measured as the next start - this end, which missed the engine's work in a step
    elif "host_gap_s" in rec and rec.get("host_gap_definition") != HOST_GAP_DEFINITION:
        saved["host_gap_earlier_definition_s"] = rec["host_gap_s"]
    return saved


def workloads():
    """Workloads A (the burst, then the staircase) and B (module docstring)."""
    burst = make_workload(WORKLOAD_A["burst"], float("inf"), Uniform(32, 500), Uniform(8, 24), seed=1)
    stair = [dataclasses.replace(r, arrival_s=STAIR_START_S + STAIR_GAP_S * i)
             for i, r in enumerate(make_workload(STAIR_REQUESTS, float("inf"), Uniform(32, 64), 48, seed=3))]
    return (
        sorted(burst + stair, key=lambda r: r.arrival_s),
        make_workload(B_REQUESTS, B_RATE, LogNormal(250, 0.6, low=32, high=1000), Uniform(12, 32), seed=2),
    )


def steps_to_json(steps) -> list:
    """``MeasuredStep`` records as ``[seconds, [[new, cached], ...]]`` (the runs file, ``RUNS``)."""
    return [[st.duration_s, [list(e) for e in st.sequences]] for st in steps]


def steps_from_json(rows) -> list[MeasuredStep]:
    return [MeasuredStep(tuple((int(n), int(c)) for n, c in seqs), float(t)) for t, seqs in rows]
