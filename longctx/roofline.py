"""Roofline model: is a step limited by compute or by memory bandwidth, and how long does it take?

Williams, Waterman & Patterson (2009), "Roofline: an insightful visual performance model"::

    arithmetic_intensity = FLOPs / bytes moved                       (FLOP/byte)
    ridge point          = peak FLOP/s / bandwidth bytes/s            (FLOP/byte)
    time_s               = max(FLOPs / (peak * compute_efficiency),
                               bytes / (bandwidth * memory_efficiency))

A kernel whose intensity is below the ridge point is memory bound. Efficiency factors (0 < e <= 1)
model the fraction of the datasheet peak a real kernel reaches; they default to 1.0 (the ideal
roofline) and can be calibrated from measurements.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from longctx.checks import nonnegative_number, positive_int, unit_fraction
from longctx.specs import HardwareSpec, dtype_bytes, get_hardware


def arithmetic_intensity(flops: float, num_bytes: float) -> float:
    """FLOPs per byte moved. ``num_bytes`` must be > 0."""
    flops = nonnegative_number("flops", flops)
    if nonnegative_number("num_bytes", num_bytes) == 0:
        raise ValueError("num_bytes must be > 0 to define an arithmetic intensity")
    return flops / float(num_bytes)


def ridge_point(
    hardware: HardwareSpec | str, compute_efficiency: float = 1.0, memory_efficiency: float = 1.0
) -> float:
    """Intensity (FLOP/byte) where compute and memory time are equal. H100 SXM: 989e12/3.35e12 = 295."""
    hw = get_hardware(hardware)
    ce = unit_fraction("compute_efficiency", compute_efficiency, "fraction of the datasheet peak")
    me = unit_fraction("memory_efficiency", memory_efficiency, "fraction of the datasheet peak")
    return (hw.peak_flops_per_s * ce) / (hw.memory_bandwidth_bytes_per_s * me)


def matmul_intensity(n: int, k: int, m: int, dtype: str = "bf16") -> float:
    """Arithmetic intensity of ``[n x k] @ [k x m]``: ``2nkm / (b * (nk + km + nm))``.

    Each operand is read once and the result written once (an ideal kernel). With n tokens against a
    square weight (k = m = d) it is ``2*n*d / (b*(d + 2n))``: about ``2n/b`` (n in bf16) for n << d, so
    decode (n = 1) is memory bound; it saturates at ``d/b`` (d/2 in bf16) for n >> d, when the activations
    outweigh the weight (bf16, d = 4096: 1,749 FLOP/byte at n = 12,000, never above 2,048).
    """
    n, k, m = (
        positive_int(f"matrix dimension {name}", v, floats=False)
        for name, v in (("n", n), ("k", k), ("m", m))
    )
    return 2 * n * k * m / (dtype_bytes(dtype) * (n * k + k * m + n * m))


@dataclass(frozen=True)
class RooflineTime:
    """Time of a step under the roofline, with both candidate times and the active bound."""

    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"`` (ties count as compute bound)."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline_time(
    flops: float, num_bytes: float, hardware: HardwareSpec | str, compute_efficiency: float = 1.0,
    memory_efficiency: float = 1.0, peak_flops_per_s: float | None = None,
) -> RooflineTime:
    """Roofline time of ``flops`` FLOPs moving ``num_bytes`` bytes on ``hardware``.

    ``peak_flops_per_s`` overrides the hardware's dense bf16 peak (e.g. its fp8 peak, or the source's
    "150 TFLOPS sustained").
    """
    hw = get_hardware(hardware)
    flops = nonnegative_number("flops", flops)
    num_bytes = nonnegative_number("num_bytes", num_bytes)
    ce = unit_fraction("compute_efficiency", compute_efficiency, "fraction of the datasheet peak")
    me = unit_fraction("memory_efficiency", memory_efficiency, "fraction of the datasheet peak")
    peak = hw.peak_flops_per_s if peak_flops_per_s is None else peak_flops_per_s
    if isinstance(peak, bool) or not isinstance(peak, numbers.Real) or not peak > 0:
        raise ValueError(f"peak_flops_per_s must be a positive number of FLOP/s, got {peak!r}")
    return RooflineTime(flops / (peak * ce), num_bytes / (hw.memory_bandwidth_bytes_per_s * me))


def step_time_s(
    flops: float, num_bytes: float, hardware: HardwareSpec | str, compute_efficiency: float = 1.0,
    memory_efficiency: float = 1.0,
) -> float:
    """``max(flops / (peak * ce), bytes / (bandwidth * me))`` in seconds."""
    return roofline_time(flops, num_bytes, hardware, compute_efficiency, memory_efficiency).time_s
