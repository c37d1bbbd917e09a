"""A cost-model executor: how long one engine iteration would take on a GPU, from FLOPs and bytes.

One iteration runs a batch of entries, each ``(new_tokens, cached_tokens)``: a prefill chunk of C tokens
after S cached tokens, or a decode (C = 1). Its time is the roofline time of the whole batch
(``longctx.flops.step_cost`` and ``longctx.roofline``) with efficiency factors, plus fixed overheads::

    compute_s = linear_flops / (peak * compute_efficiency) + attention_flops / (peak * attention_efficiency)
    memory_s  = (weight + KV read + KV write bytes) / (bandwidth * memory_efficiency)
    step_s    = step_overhead_s + per_sequence_overhead_s * entries + max(compute_s, memory_s)

Efficiencies are in (0, 1] and overheads >= 0, so no step beats the roofline: a decode step never takes
less than the weights' bytes over the bandwidth, a prefill never exceeds peak FLOP/s. ``calibrate`` fits
the five factors to measured step times (weighted least squares on relative error; no scipy).
Pure Python + numpy: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from longctx.engine.executor import ExecutionResult
from longctx.engine.scheduler import ScheduledBatch
from longctx.memory import kv_bytes_per_token
from longctx.specs import HardwareSpec, ModelSpec, dtype_bytes, get_hardware, get_model

# Assumed (not measured) defaults for a tuned GPU engine: kernels reach a fraction of datasheet peak
# and each iteration pays a fixed launch/scheduling cost. Calibrate against measurements to replace them.
DEFAULT_COMPUTE_EFFICIENCY = 0.6
DEFAULT_ATTENTION_EFFICIENCY = 0.5
DEFAULT_MEMORY_EFFICIENCY = 0.8
DEFAULT_STEP_OVERHEAD_S = 1e-3
DEFAULT_PER_SEQUENCE_OVERHEAD_S = 5e-6

FACTOR_NAMES = (
    "step_overhead_s",
    "per_sequence_overhead_s",
    "compute_efficiency",
    "attention_efficiency",
    "memory_efficiency",
)


@dataclass(frozen=True)
class CostFactors:
    """Efficiency factors (fraction of datasheet peak, in (0, 1]) and overheads (seconds, >= 0)."""

    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    attention_efficiency: float = DEFAULT_ATTENTION_EFFICIENCY
    memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    per_sequence_overhead_s: float = DEFAULT_PER_SEQUENCE_OVERHEAD_S

    def __post_init__(self) -> None:
        for name in ("compute_efficiency", "attention_efficiency", "memory_efficiency"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ValueError(f"{name} must be in (0, 1] (fraction of the datasheet peak), got {v!r}")
        for name in ("step_overhead_s", "per_sequence_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {v!r}")

    @classmethod
    def ideal(cls) -> CostFactors:
        """The bare roofline: full efficiency, no overhead."""
        return cls(1.0, 1.0, 1.0, 0.0, 0.0)


@dataclass(frozen=True)
class StepBreakdown:
    """Where one step's modelled time goes (seconds)."""

    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def time_s(self) -> float:
        return self.overhead_s + max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class StepFeatures:
    """Ideal (efficiency 1) times of one step's parts: what ``calibrate`` regresses on."""

    linear_s: float
    attention_s: float
    memory_s: float
    num_sequences: int


class CostModelExecutor:
    """An ``Executor`` that returns the modelled time of a batch on ``hardware`` for ``model``.

    Args:
        model, hardware: registry names or specs (``longctx.specs``).
        factors: ``CostFactors`` (defaults: assumed GPU values; see ``calibrate``).
        weight_dtype, kv_dtype: storage dtypes of the weights and the KV cache (bytes moved).
        attention: ``"causal"`` (FlashAttention convention) or ``"full"``.
    """

    def __init__(
        self,
        model: ModelSpec | str,
        hardware: HardwareSpec | str,
        factors: CostFactors | None = None,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        attention: str = "causal",
    ) -> None:
        if attention not in ("causal", "full"):
            raise ValueError(f"attention must be 'causal' or 'full', got {attention!r}")
        self.model = get_model(model)
        self.hardware = get_hardware(hardware)
        self.factors = factors if factors is not None else CostFactors()
        self.weight_dtype, self.kv_dtype, self.attention = weight_dtype, kv_dtype, attention
        m = self.model
        self._linear_flops_per_token = 2 * m.num_params  # params="all", as longctx.flops
        self._attention_flops_per_pair = 4 * m.num_layers * m.d_attn
        self.weight_bytes = int(m.num_params * dtype_bytes(weight_dtype))
        self.kv_bytes_per_token = kv_bytes_per_token(m, kv_dtype)

    # ---- the cost of a list of (new_tokens, cached_tokens) ----
    def features(self, sequences: Iterable[tuple[int, int]]) -> StepFeatures:
        """Ideal compute and memory times of a step (numbers as ``longctx.flops.step_cost``)."""
        tokens = pairs = cached = n = 0
        causal = self.attention == "causal"
        for c, s in sequences:
            tokens += c
            cached += s
            pairs += c * s + (c * (c + 1) // 2 if causal else c * c)
            n += 1
        peak = self.hardware.peak_flops_per_s
        bw = self.hardware.memory_bandwidth_bytes_per_s
        num_bytes = self.weight_bytes + (cached + tokens) * self.kv_bytes_per_token
        return StepFeatures(
            linear_s=tokens * self._linear_flops_per_token / peak,
            attention_s=pairs * self._attention_flops_per_pair / peak,
            memory_s=num_bytes / bw,
            num_sequences=n,
        )

    def breakdown(self, sequences: Iterable[tuple[int, int]]) -> StepBreakdown:
        f, k = self.features(sequences), self.factors
        return StepBreakdown(
            compute_s=f.linear_s / k.compute_efficiency + f.attention_s / k.attention_efficiency,
            memory_s=f.memory_s / k.memory_efficiency,
            overhead_s=k.step_overhead_s + k.per_sequence_overhead_s * f.num_sequences,
        )

    def step_time_s(self, sequences: Iterable[tuple[int, int]]) -> float:
        """Modelled seconds of one step over ``(new_tokens, cached_tokens)`` pairs."""
        return self.breakdown(sequences).time_s

    # ---- the Executor protocol ----
    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        seqs = [(e.num_tokens, e.seq.num_computed_tokens) for e in batch.entries]
        return ExecutionResult(duration_s=self.step_time_s(seqs), next_token_ids=None)

    def with_factors(self, factors: CostFactors) -> CostModelExecutor:
        return CostModelExecutor(self.model, self.hardware, factors, self.weight_dtype, self.kv_dtype,
                                 self.attention)

    def __repr__(self) -> str:
        return f"CostModelExecutor({self.model.name}, {self.hardware.name}, {self.factors})"


# ---- recording real steps, for calibration -------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredStep:
    """One measured iteration: its entries ``(new_tokens, cached_tokens)`` and its time in seconds."""

    sequences: tuple[tuple[int, int], ...]
    duration_s: float


@dataclass
class RecordingExecutor:
    """Wraps any executor and records each batch's composition and measured duration (no torch here)."""

    inner: object
    steps: list[MeasuredStep] = field(default_factory=list)

    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        seqs = tuple((e.num_tokens, e.seq.num_computed_tokens) for e in batch.entries)
        result = self.inner.execute(batch)
        self.steps.append(MeasuredStep(seqs, float(result.duration_s)))
        return result


# ---- calibration -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Result of ``calibrate``: the fitted factors and how well they fit (relative errors)."""

    factors: CostFactors
    median_abs_rel_error: float
    max_abs_rel_error: float
    num_steps: int
    clipped: tuple[str, ...]  # efficiencies the fit wanted above 1 (the hardware spec's peak is too low)


def _fit_branch(x_cols: np.ndarray, y: np.ndarray, lower: np.ndarray, fixed: dict[int, float]) -> np.ndarray:
    """Least squares for y ~ X @ theta with theta >= lower (active set: clamp, re-solve)."""
    k = x_cols.shape[1]
    theta = np.zeros(k)
    clamp = dict(fixed)
    for _ in range(k + 1):
        free = [j for j in range(k) if j not in clamp]
        resid = y - sum((x_cols[:, j] * v for j, v in clamp.items()), np.zeros_like(y))
        sol = np.zeros(k)
        if free:
            sol_free, *_ = np.linalg.lstsq(x_cols[:, free], resid, rcond=None)
            sol[free] = sol_free
        for j, v in clamp.items():
            sol[j] = v
        bad = [j for j in free if sol[j] < lower[j]]
        if not bad:
            theta = sol
            break
        worst = min(bad, key=lambda j: sol[j] - lower[j])
        clamp[worst] = lower[worst]
        theta = np.maximum(sol, lower)
    return theta


def calibrate(
    executor: CostModelExecutor,
    steps: Sequence[MeasuredStep],
    fit: Iterable[str] = FACTOR_NAMES,
    iterations: int = 30,
) -> Calibration:
    """Fit ``executor``'s factors to measured steps; returns a ``Calibration`` (use ``.factors``).

    Model: ``t = o + p * entries + max(a_lin * linear_s + a_att * attention_s, a_mem * memory_s)`` with
    ``a = 1 / efficiency >= 1`` and ``o, p >= 0`` (the roofline is never beaten). The max is handled by
    alternating: assign each step to its current bound, solve a weighted least squares (weights 1/t, so the
    fit minimises relative error), repeat. Factors not in ``fit`` keep ``executor.factors``' values.
    """
    fit = tuple(fit)
    for name in fit:
        if name not in FACTOR_NAMES:
            raise ValueError(f"unknown factor {name!r}; allowed: {', '.join(FACTOR_NAMES)}")
    steps = list(steps)
    if len(steps) < 2:
        raise ValueError(f"calibrate needs at least 2 measured steps, got {len(steps)}")
    feats = [executor.features(s.sequences) for s in steps]
    y = np.array([s.duration_s for s in steps], dtype=float)
    if np.any(y <= 0):
        raise ValueError("measured step durations must be > 0")
    ones = np.ones(len(steps))
    ent = np.array([f.num_sequences for f in feats], float)
    lin = np.array([f.linear_s for f in feats])
    att = np.array([f.attention_s for f in feats])
    mem = np.array([f.memory_s for f in feats])
    k0 = executor.factors
    cur = np.array([k0.step_overhead_s, k0.per_sequence_overhead_s, 1 / k0.compute_efficiency,
                    1 / k0.attention_efficiency, 1 / k0.memory_efficiency])
    lower = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    fixed = {j: cur[j] for j, name in enumerate(FACTOR_NAMES) if name not in fit}
    w = 1.0 / y

    def predict(th: np.ndarray) -> np.ndarray:
        return th[0] + th[1] * ent + np.maximum(th[2] * lin + th[3] * att, th[4] * mem)

    best, best_loss = cur, float(np.sum(((predict(cur) - y) * w) ** 2))
    for start in ("model", "compute", "memory"):
        if start == "model":
            compute_bound = cur[2] * lin + cur[3] * att >= cur[4] * mem
        else:
            compute_bound = np.full(len(y), start == "compute")
        for _ in range(iterations):
            cb = compute_bound.astype(float)
            x = np.stack([ones, ent, lin * cb, att * cb, mem * (1 - cb)], axis=1)
            # A bound with no steps leaves its factor undetermined: keep the current value.
            fx = dict(fixed)
            for j in (2, 3):
                if not np.any(x[:, j] > 0):
                    fx.setdefault(j, cur[j])
            if not np.any(x[:, 4] > 0):
                fx.setdefault(4, cur[4])
            th = _fit_branch(x * w[:, None], y * w, lower, fx)
            loss = float(np.sum(((predict(th) - y) * w) ** 2))
            if loss < best_loss - 1e-15:
                best, best_loss = th, loss
            new_bound = th[2] * lin + th[3] * att >= th[4] * mem
            if np.array_equal(new_bound, compute_bound):
                break
            compute_bound = new_bound
    rel = np.abs(predict(best) - y) / y
    values = [float(best[0]), float(best[1]), float(1 / best[2]), float(1 / best[3]), float(1 / best[4])]
    factors = replace(k0, **{n: v for n, v in zip(FACTOR_NAMES, values, strict=True) if n in fit})
    clipped = tuple(n for j, n in enumerate(FACTOR_NAMES) if j >= 2 and n in fit and best[j] <= 1.0 + 1e-12)
    return Calibration(factors, float(np.median(rel)), float(np.max(rel)), len(steps), clipped)
