"""Timing GPU (and CPU) work: warm-up calls, then the median of timed repeats.

On a CUDA device each repeat is bracketed by CUDA events (``torch.cuda.Event(enable_timing=True)``), so the
time is the device's, not the Python loop's; the events are read after one ``synchronize`` at the end. On
the CPU (toy runs and tests) ``time.perf_counter`` brackets each call. The median resists the occasional
slow repeat (a clock ramping up, another process).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: ``median_s`` of ``repeats`` timed calls after warm-up."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    timer: str  # "cuda-events" or "perf_counter"

    def to_dict(self) -> dict:
        return asdict(self)


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def time_fn(fn: Callable[[], object], device="cpu", warmup: int = 2, repeats: int = 5) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then the median of ``repeats`` timed calls."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        times = [start.elapsed_time(end) / 1e3 for start, end in events]  # ms -> s
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    timer = "cuda-events" if is_cuda(device) else "perf_counter"
    return Timing(statistics.median(times), min(times), max(times), repeats, timer)
