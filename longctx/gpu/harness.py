"""Timing GPU (and CPU) work: warm-up runs, then the median of timed repeats.

On a CUDA device each repeat is bracketed by CUDA events (``torch.cuda.Event(enable_timing=True)``), so the
time is the device's, not the Python loop's; the events are read after one ``synchronize`` at the end. On
the CPU (toy runs and tests) ``time.perf_counter`` brackets each call; there is nothing to synchronize.
The median resists the occasional slow repeat (a clock ramping up, another process).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: ``median_s`` of ``repeats`` timed calls after warm-up."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int
    timer: str  # "cuda-events" or "perf_counter"

    def to_dict(self) -> dict:
        return {"median_s": self.median_s, "min_s": self.min_s, "max_s": self.max_s,
                "repeats": self.repeats, "timer": self.timer}


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device="cpu", warmup: int = 2, repeats: int = 5) -> Timing:
    """Time ``fn()`` on ``device``: ``warmup`` untimed calls, then the median of ``repeats`` timed calls."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    if is_cuda(device):
        import torch

        synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        synchronize(device)
        times = [start.elapsed_time(end) / 1e3 for start, end in events]  # ms -> s
        timer = "cuda-events"
    else:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        timer = "perf_counter"
    return Timing(statistics.median(times), min(times), max(times), repeats, warmup, timer)


def time_sequence(fns: list[Callable[[], object]], device="cpu", warmup: int = 1, repeats: int = 3
                  ) -> tuple[list[float], float]:
    """Run ``fns`` in order as one unit (e.g. the chunks of one prompt); time each and the whole.

    Returns ``(median seconds of each fn, median seconds of the whole sequence)`` over ``repeats`` passes
    after ``warmup`` untimed passes. Events (or perf_counter) bracket each call inside one pass.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        for f in fns:
            f()
    per_pass: list[list[float]] = []
    if is_cuda(device):
        import torch

        synchronize(device)
        passes = []
        for _ in range(repeats):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(fns) + 1)]
            ev[0].record()
            for f, e in zip(fns, ev[1:], strict=True):
                f()
                e.record()
            passes.append(ev)
        synchronize(device)
        per_pass = [[a.elapsed_time(b) / 1e3 for a, b in zip(ev, ev[1:], strict=False)] for ev in passes]
    else:
        for _ in range(repeats):
            marks = [time.perf_counter()]
            for f in fns:
                f()
                marks.append(time.perf_counter())
            per_pass.append([b - a for a, b in zip(marks, marks[1:], strict=False)])
    each = [statistics.median(p[i] for p in per_pass) for i in range(len(fns))]
    whole = statistics.median(sum(p) for p in per_pass)
    return each, whole
