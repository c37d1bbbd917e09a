"""A ``HardwareSpec`` for this machine's CPU, from a measurement (never from a datasheet guess).

``measure_cpu_hardware`` times numpy's fp32 GEMM (the best of a few sizes: the "peak") and a large array
copy (read + write bytes: the "bandwidth"). The simulator then models the real engine on this CPU, and
``calibrate`` fits how far the real engine's steps fall short of these two numbers.

``probe_gemm_s`` is a speed probe: the median time of one fixed GEMM (256 x 576 through 576 x 3,072, fp32:
a SmolLM2 gate+up at a 256-token chunk) over about a second. Repeated through a measurement it shows how
steady the machine was: on a shared VM both compute- and memory-bound kernels have been seen to wander by
25-31 % between 5-second windows within two minutes. numpy only.
"""

from __future__ import annotations

import os
import time

import numpy as np

from longctx.specs import HardwareSpec


def _best_time_s(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peak_flops_per_s(sizes=(512, 1024, 2048), repeats: int = 3, seed: int = 0) -> float:
    """Best fp32 GEMM throughput (FLOP/s) over square sizes: ``2 n^3 / time``."""
    rng = np.random.default_rng(seed)
    best = 0.0
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        a @ b  # warm-up
        best = max(best, 2 * n**3 / _best_time_s(lambda a=a, b=b: a @ b, repeats))
    return best


def measure_bandwidth_bytes_per_s(num_bytes: int = 256 * 2**20, repeats: int = 3) -> float:
    """Copy bandwidth (bytes read + written per second) of a ``num_bytes`` fp32 array."""
    src = np.ones(num_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm-up, page faults
    return 2 * src.nbytes / _best_time_s(lambda: np.copyto(dst, src), repeats)


def measure_cpu_hardware(name: str = "cpu-measured") -> HardwareSpec:
    """This CPU as a ``HardwareSpec`` (fp32 GEMM peak, copy bandwidth, physical memory)."""
    peak = measure_peak_flops_per_s()
    bw = measure_bandwidth_bytes_per_s()
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = 8e9
    return HardwareSpec(name, peak, bw, mem,
                        source=f"measured on this machine by longctx.sim.hardware ({os.cpu_count()} cores): "
                               "numpy fp32 GEMM best of 512/1024/2048, 256 MiB copy")


def probe_gemm_s(seconds: float = 1.0, seed: int = 0) -> float:
    """Median seconds of one fixed fp32 GEMM (``[256, 576] @ [576, 3072]``) over about ``seconds`` (module
    docstring)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((256, 576), dtype=np.float32)
    b = rng.standard_normal((576, 3072), dtype=np.float32)
    a @ b  # warm-up
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 5:
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return float(np.median(times))
