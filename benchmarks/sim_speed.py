"""How fast is the simulator? 10,000 requests of Llama-3-8B on an H100 (target: under 10 s on one core).

    .venv/bin/python benchmarks/sim_speed.py [--num-requests 10000]

Workload: vLLM benchmark_serving's random-dataset defaults (1,024 prompt + 128 output tokens), Poisson
arrivals at 20 req/s, chunked prefill with a 512-token budget. Prints wall and CPU seconds and simulated
requests per wall second. The run is single-threaded pure Python (no torch).
"""

from __future__ import annotations

import argparse
import time

from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler
from longctx.sim import make_workload, simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    rows = []
    for name, sched in (("chunked-512", ChunkedPrefillScheduler(512)), ("monolithic", MonolithicScheduler())):
        wl = make_workload(args.num_requests, args.rate, 1024, 128, seed=0)
        wall, cpu = time.perf_counter(), time.process_time()
        r = simulate(wl, sched, "llama-3-8b", "h100")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        rows.append((name, len(r.steps), r.metrics.duration_s, wall, cpu, args.num_requests / wall))
    print(f"{'scheduler':<12}{'steps':>9}{'sim time s':>12}{'wall s':>9}{'cpu s':>9}{'req/wall s':>12}  target")
    for name, steps, sim_s, wall, cpu, rps in rows:
        verdict = "ok (<10 s)" if cpu < 10 else "SLOW"
        print(f"{name:<12}{steps:>9,}{sim_s:>12.1f}{wall:>9.2f}{cpu:>9.2f}{rps:>12,.0f}  {verdict}")


if __name__ == "__main__":
    main()
