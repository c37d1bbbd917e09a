"""The simulator's cost factors and the records of one modelled step: ``CostFactors`` (fitted H100 defaults,
``CostFactors.assumed()`` for the whole-batch form), ``StepBreakdown`` and ``StepFeatures``. Their use is in
``longctx.sim.cost_model``, which re-exports them. Pure Python: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from longctx.roofline import RooflineTime

COST_FORMS = ("operator", "batch")
# Fitted on Vidur's H100 profiles (5 models, TP 1/2/4/8, 1 ... 4,096 tokens) by
# longctx.sim.calibration.fit_profiles(); tests/test_sim_calibration.py refits and compares.
FITTED_H100 = {
    "compute_efficiency": 0.7991,  # of whole tiles in whole waves (longctx.sim.operators), not of 2 n k m
    "memory_efficiency": 1.0,
    "serial_fraction": 0.3233,
    "kernel_overhead_s": 6.615e-06,
    "elementwise_efficiency": 0.7658,
    "elementwise_overhead_s": 2.015e-06,
}
GEMM_TILE_TOKENS = 128  # rows of a GEMM tile (chosen by the fit among 1, 64, 128, 256: the lowest error)
GEMM_WAVE_SMS = 132  # tiles per wave: an H100 SXM's SMs (datasheet; 114 or 144 fit the profiles worse)
# Assumed (not measured): attention kernels, the engine's per-step and per-sequence overheads.
ASSUMED = {"attention_efficiency": 0.5, "step_overhead_s": 1e-3, "per_sequence_overhead_s": 5e-6}
# The earlier assumed whole-batch factors (the "batch" form's default).
ASSUMED_BATCH = {"compute_efficiency": 0.6, "memory_efficiency": 0.8, **ASSUMED}

FACTOR_NAMES = (
    "step_overhead_s", "per_sequence_overhead_s", "compute_efficiency", "attention_efficiency",
    "memory_efficiency",
)
EFFICIENCIES = ("compute_efficiency", "attention_efficiency", "memory_efficiency", "elementwise_efficiency")
SECONDS = ("step_overhead_s", "per_sequence_overhead_s", "kernel_overhead_s", "elementwise_overhead_s")


@dataclass(frozen=True)
class CostFactors:
    """Efficiencies (fraction of datasheet peak, in (0, 1]), overheads (seconds, >= 0), the GEMM
    ``serial_fraction`` (in [0, 1]: 0 = compute and memory overlap perfectly), ``gemm_tile_tokens`` (rows
    of a GEMM tile; 1: no tile or wave quantization) and ``gemm_wave_sms`` (tiles per wave: the GPU's SMs,
    132 on an H100 SXM; set 108 for an A100).

    The first five apply to both forms; the rest only to ``form="operator"`` (``longctx.sim.operators``).
    Defaults: fitted H100 values (``FITTED_H100``) and assumed ones (``ASSUMED``); see the module docstring.
    """

    compute_efficiency: float = FITTED_H100["compute_efficiency"]
    attention_efficiency: float = ASSUMED["attention_efficiency"]
    memory_efficiency: float = FITTED_H100["memory_efficiency"]
    step_overhead_s: float = ASSUMED["step_overhead_s"]
    per_sequence_overhead_s: float = ASSUMED["per_sequence_overhead_s"]
    serial_fraction: float = FITTED_H100["serial_fraction"]
    kernel_overhead_s: float = FITTED_H100["kernel_overhead_s"]
    elementwise_efficiency: float = FITTED_H100["elementwise_efficiency"]
    elementwise_overhead_s: float = FITTED_H100["elementwise_overhead_s"]
    gemm_tile_tokens: int = GEMM_TILE_TOKENS
    gemm_wave_sms: int = GEMM_WAVE_SMS

    def __post_init__(self) -> None:
        for name in EFFICIENCIES:
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1] (fraction of the datasheet peak), got {v!r}")
        for name in SECONDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        s = self.serial_fraction
        if isinstance(s, bool) or not (isinstance(s, (int, float)) and 0 <= s <= 1):
            raise ValueError(f"serial_fraction must be in [0, 1] (0: compute and memory overlap), got {s!r}")
        t = self.gemm_tile_tokens
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"gemm_tile_tokens must be a positive integer (1: no tile rounding), got {t!r}")
        w = self.gemm_wave_sms
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"gemm_wave_sms must be a positive integer (the GPU's SMs), got {w!r}")

    @classmethod
    def ideal(cls) -> CostFactors:
        """The bare roofline: full efficiency, no overhead, perfect overlap, no tile or wave rounding."""
        return cls(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1)

    @classmethod
    def assumed(cls) -> CostFactors:
        """The earlier assumed factors (60 % of peak for matmuls, 50 % attention, 80 % bandwidth, 1 ms per
        step, 5 us per sequence): the ``"batch"`` form's default."""
        return cls(**ASSUMED_BATCH)

    def sources(self) -> dict[str, str]:
        """Each factor's provenance: ``"fitted (Vidur H100 profiles)"``, ``"assumed"`` or ``"given"``."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if (
                f.name in FITTED_H100
                and v == FITTED_H100[f.name]
                or f.name == "gemm_tile_tokens"
                and v == GEMM_TILE_TOKENS
            ):
                out[f.name] = "fitted (Vidur H100 profiles)"
            elif f.name == "gemm_wave_sms" and v == GEMM_WAVE_SMS:
                out[f.name] = "datasheet (H100 SXM)"
            elif v == ASSUMED.get(f.name, ASSUMED_BATCH.get(f.name)):
                out[f.name] = "assumed"
            else:
                out[f.name] = "given"
        return out

    def describe(self) -> str:
        """One line per provenance, e.g. ``fitted (Vidur H100 profiles): compute_efficiency=0.759, ...``."""
        groups: dict[str, list[str]] = {}
        for name, src in self.sources().items():
            groups.setdefault(src, []).append(f"{name}={getattr(self, name):.4g}")
        return "; ".join(f"{src}: {', '.join(items)}" for src, items in groups.items())


@dataclass(frozen=True)
class StepBreakdown(RooflineTime):
    """Where one step's modelled time goes (seconds): ``time_s = overhead_s + work_s``.

    ``compute_s``, ``memory_s`` and ``bound`` are a ``roofline.RooflineTime``'s: the step's compute and memory
    terms (``"batch"``: the two sides of its one roofline, ``work_s = max``; ``"operator"``: sums over its
    operators of each side, ``work_s`` the operators' exact time).
    """

    overhead_s: float
    work_s: float

    @property
    def time_s(self) -> float:
        return self.overhead_s + self.work_s


@dataclass(frozen=True)
class StepFeatures:
    """Ideal (efficiency 1) times of one step's parts in the ``"batch"`` form: what ``calibrate`` regresses
    on."""

    linear_s: float
    attention_s: float
    memory_s: float
    num_sequences: int
