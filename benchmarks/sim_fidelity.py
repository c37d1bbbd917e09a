"""Simulator fidelity: calibrate on one workload run by the real engine on this CPU, predict another.

1. Measure this CPU (numpy GEMM peak, copy bandwidth) as a ``HardwareSpec``.
2. Workload A (calibration): the real engine (SmolLM2-135M, fp32, ``TorchExecutor``) serves 10 requests
   sent at once, chunked prefill with a 256-token budget; every step's composition and time is recorded
   and ``calibrate`` fits the cost model's efficiencies and overheads.
3. Workload B (prediction, different lengths, arrivals and budget): Poisson arrivals, lognormal prompts,
   chunked prefill with a 512-token budget. Run on the real engine (wall clock) and in the simulator
   (calibrated cost model, virtual clock, same requests); compare median TTFT and P99 ITL.

    .venv/bin/python benchmarks/sim_fidelity.py [--record]

Target: both errors within 5 % (issue 26). Runs on one thread (set OMP_NUM_THREADS to change); other processes on
the CPU disturb the measurement: run it alone.

What the fitted ``per_sequence_overhead_s`` is (recorded: 48 ms; 25 ms in a rerun on 2026-12-01 with the
machine at load ~9): not Python bookkeeping in the engine loop, but work inside the model's forward pass
that grows with each decoding sequence and that the roofline's ``max(compute, memory)`` cannot express.
Measured on SmolLM2 fp32, one thread, 10 decodes at 280 cached tokens each, the model alone (no engine):
forward 469-709 ms against 170-217 ms for its weight matmuls alone; torch's profiler puts 53 % in
``aten::mm`` (skinny [n, d] GEMMs far below peak) and 34 % in ``aten::index``: the gather that copies
each sequence's cached K/V out of the paged pool every step (146 ms for 2,800 cached tokens, ~10x the
copy bandwidth). A forward with n = 1, 4, 10 decodes took 202, 418, 709 ms: ~56 ms per extra sequence on
that loaded machine. The cost model counts those K/V bytes once at full bandwidth and hides decode FLOPs
behind the weight reads, so the fit books the gap per sequence. Cheaper decode attention (reading keys in
place instead of gathering them) would shrink it; the term stays a fitted constant of this CPU engine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import time

# One core for everything (torch and numpy's BLAS): oversubscribed threads make step times erratic.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402  (after the thread variables)

from longctx.engine import ChunkedPrefillScheduler, Engine, VirtualClock, WallClock, summarize  # noqa: E402
from longctx.provenance import git_commit, load_gate, machine  # noqa: E402
from longctx.sim import (  # noqa: E402
    CostFactors,
    CostModelExecutor,
    LogNormal,
    RecordingExecutor,
    Uniform,
    calibrate,
    make_workload,
)
from longctx.sim.hardware import measure_cpu_hardware  # noqa: E402

RECORD = pathlib.Path(__file__).resolve().parents[1] / "longctx" / "data" / "recorded" / "sim_fidelity.json"
NUM_BLOCKS, BLOCK_SIZE = 512, 16


def run_real(model, workload, scheduler, vocab_size, seed=0):
    """Serve ``workload`` on the real model in real time; returns (finished sequences, recorded steps)."""
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
    return engine.finished, rec.steps


def run_sim(executor, workload, scheduler):
    engine = Engine(executor, scheduler, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, clock=VirtualClock(),
                    max_model_len=8192)
    for r in workload:
        engine.add_request([0] * r.prompt_tokens, r.output_tokens, arrival_s=r.arrival_s)
    return engine.run_until_done()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    ap.add_argument("--force", action="store_true", help="record despite the load (marks the record unusable)")
    args = ap.parse_args()
    gate_load = load_gate(int(os.environ["OMP_NUM_THREADS"]), args.force) if args.record else os.getloadavg()[0]
    import torch

    from longctx.model.weights import load_model

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    model = load_model()
    vocab = model.config.vocab_size
    hw = measure_cpu_hardware()
    print(f"CPU ({torch.get_num_threads()} torch threads): {hw.peak_flops_per_s / 1e9:.1f} GFLOP/s fp32 GEMM, "
          f"{hw.memory_bandwidth_bytes_per_s / 1e9:.1f} GB/s copy", flush=True)
    # A CPU runs no GEMM tiles in waves over SMs: the operator form without the H100's tile quantization;
    # calibrate() fits the five step factors on A.
    ex = CostModelExecutor("smollm2-135m", hw, CostFactors(gemm_tile_tokens=1), weight_dtype="fp32", kv_dtype="fp32")

    # warm-up (first torch calls are slow)
    run_real(model, make_workload(2, float("inf"), 64, 4, seed=99), ChunkedPrefillScheduler(256), vocab)

    wl_a = make_workload(10, float("inf"), Uniform(32, 500), Uniform(8, 24), seed=1)
    t0 = time.perf_counter()
    _, steps_a = run_real(model, wl_a, ChunkedPrefillScheduler(256), vocab)
    cal = calibrate(ex, steps_a)
    print(f"calibration on A: {len(steps_a)} steps in {time.perf_counter() - t0:.1f} s; fit median |error| "
          f"{100 * cal.median_abs_rel_error:.1f} %, max {100 * cal.max_abs_rel_error:.1f} %; clipped {cal.clipped}", flush=True)
    print("  factors: " + ", ".join(f"{k}={v:.3g}" for k, v in vars(cal.factors).items()))

    wl_b = make_workload(12, 1.0, LogNormal(250, 0.6, low=32, high=1000), Uniform(12, 32), seed=2)
    t0 = time.perf_counter()
    real_b, steps_b = run_real(model, wl_b, ChunkedPrefillScheduler(512), vocab, seed=2)
    real_wall_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sim_b = run_sim(ex.with_factors(cal.factors), wl_b, ChunkedPrefillScheduler(512))
    sim_wall_s = time.perf_counter() - t0
    m_real, m_sim = summarize(real_b), summarize(sim_b)
    rows = [
        ("median TTFT", m_sim.ttft.median, m_real.ttft.median),
        ("P99 ITL", m_sim.itl.p(99), m_real.itl.p(99)),
        ("median ITL", m_sim.itl.median, m_real.itl.median),
        ("median E2E", m_sim.e2e.median, m_real.e2e.median),
    ]
    print(f"\nworkload B: {len(wl_b)} requests, Poisson 1 req/s, chunked-512 "
          f"(real {real_wall_s:.1f} s, simulated in {sim_wall_s:.2f} s)")
    print(f"{'metric':<14}{'predicted ms':>14}{'measured ms':>13}{'error':>9}  target")
    out = []
    for name, pred, meas in rows:
        err = (pred - meas) / meas
        target = "ok (<= 5 %)" if abs(err) <= 0.05 else "MISSED"
        if name in ("median TTFT", "P99 ITL"):
            print(f"{name:<14}{1e3 * pred:>14.1f}{1e3 * meas:>13.1f}{100 * err:>8.1f}%  {target}")
        else:
            print(f"{name:<14}{1e3 * pred:>14.1f}{1e3 * meas:>13.1f}{100 * err:>8.1f}%  (extra)")
        out.append({"metric": name, "predicted_s": pred, "measured_s": meas, "error": err})
    # step-level check on B's own measured steps (the batches the real engine ran)
    step_err = [abs(ex.with_factors(cal.factors).step_time_s(s.sequences) - s.duration_s) / s.duration_s
                for s in steps_b]
    print(f"per-step |error| on B's real batches: median {100 * np.median(step_err):.1f} %, "
          f"P90 {100 * np.percentile(step_err, 90):.1f} %")
    if args.record:
        RECORD.write_text(json.dumps({
            "what": "simulator fidelity: calibrate on workload A (real engine, this CPU), predict workload B",
            "produced_by": "benchmarks/sim_fidelity.py",
            "date": datetime.date.today().isoformat(),
            "python": platform.python_version(), "torch": torch.__version__, "commit": git_commit(),
            "machine": machine(), "load_average_1min_start": gate_load, "usable": not args.force,
            "cpu": {"peak_flops_per_s": hw.peak_flops_per_s, "bandwidth_bytes_per_s": hw.memory_bandwidth_bytes_per_s,
                    "torch_threads": torch.get_num_threads()},
            "calibration": {"factors": vars(cal.factors), "num_steps": cal.num_steps,
                            "median_abs_rel_error": cal.median_abs_rel_error},
            "rows": out,
            "step_error_median": float(np.median(step_err)),
        }, indent=1) + "\n")
        print(f"recorded {RECORD}")


if __name__ == "__main__":
    main()
