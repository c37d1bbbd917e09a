"""A cost-model executor: how long one engine iteration would take on a GPU, from FLOPs and bytes.

One iteration runs a batch of entries, each ``(new_tokens, cached_tokens)``: a prefill chunk of C tokens
after S cached tokens, or a decode (C = 1). Its FLOPs and bytes are ``longctx.flops.step_cost``'s (the
same conventions, explicit: ``params`` and ``attention``; KV bytes are what the paged pool holds per token,
``longctx.kv.quant.pool_bytes_per_token``, quantization scales included, as the engine's cache stores
them: equal to ``step_cost``'s element bytes for fp32/fp16/bf16, a little more for fp8/int8/int4);
its time is the roofline time of the whole
batch with efficiency factors, plus fixed overheads::

    compute_s = linear_flops / (peak * compute_efficiency) + attention_flops / (peak * attention_efficiency)
    memory_s  = (weight + KV read + KV write bytes) / (bandwidth * memory_efficiency)
    step_s    = step_overhead_s + per_sequence_overhead_s * entries + max(compute_s, memory_s)

Efficiencies are in (0, 1] and overheads >= 0, so no step beats the roofline: a decode step never takes
less than the weights' bytes over the bandwidth, a prefill never exceeds peak FLOP/s.
``longctx.sim.calibration.calibrate`` fits the five factors to measured steps (``longctx.sim.recording``).
Pure Python: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from longctx import flops
from longctx.engine.executor import ExecutionResult, Executor
from longctx.kv.quant import pool_bytes_per_token
from longctx.specs import HardwareSpec, ModelSpec, get_hardware, get_model

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


class CostModelExecutor(Executor):
    """An ``Executor`` that returns the modelled time of a batch on ``hardware`` for ``model``.

    Args:
        model, hardware: registry names or specs (``longctx.specs``).
        factors: ``CostFactors`` (defaults: assumed GPU values; see ``longctx.sim.calibration``).
        weight_dtype, kv_dtype: storage dtypes of the weights and the KV cache (bytes moved; KV bytes per
            token are ``quant.pool_bytes_per_token``, scales included).
        attention: ``"causal"`` (FlashAttention convention) or ``"full"``.
        params: the linear-FLOP convention of ``longctx.flops`` (``"matmul"``, the course's, or ``"all"``).
        kv_compression_ratio: KV pruning modelled as a press would do it in the engine: when a prefill
            ends, ``floor(ratio * T)`` of its ``T`` cached tokens are evicted (their blocks freed, later
            steps read fewer KV bytes). The press's own scoring time is not charged. 0: no pruning.
    """

    def __init__(
        self,
        model: ModelSpec | str,
        hardware: HardwareSpec | str,
        factors: CostFactors | None = None,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        attention: str = "causal",
        params: str = "matmul",
        kv_compression_ratio: float = 0.0,
    ) -> None:
        if not 0.0 <= float(kv_compression_ratio) < 1.0:
            raise ValueError(f"kv_compression_ratio must be in [0, 1), got {kv_compression_ratio!r}")
        self.kv_compression_ratio = float(kv_compression_ratio)
        if attention not in flops.ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(flops.ATTENTION_KINDS)}; got {attention!r}")
        self.model = m = get_model(model)
        self.hardware = get_hardware(hardware)
        self.factors = factors if factors is not None else CostFactors()
        self.weight_dtype, self.kv_dtype, self.attention, self.params = weight_dtype, kv_dtype, attention, params
        # flops.step_cost's terms, per unit: linear in tokens, in logit rows (one per entry) and in pairs.
        self._linear_flops_per_token = flops.linear_flops(m, 1, params, logit_tokens=0)
        self._linear_flops_per_entry = (flops.linear_flops(m, 1, params, logit_tokens=1)
                                        - self._linear_flops_per_token)
        self._attention_flops_per_pair = flops.attention_flops(m, 1, "full")  # one (query, key) pair
        self.weight_bytes = flops.step_cost(m, [], attention, params, weight_dtype, kv_dtype).weight_bytes
        self.kv_bytes_per_token = pool_bytes_per_token(m, kv_dtype)  # scales included (fp8/int8/int4)

    # ---- the cost of a list of (new_tokens, cached_tokens) ----
    def features(self, sequences: Iterable[tuple[int, int]]) -> StepFeatures:
        """Ideal compute and memory times of a step (``flops.step_cost``'s FLOPs and bytes over the roofline)."""
        tokens = pairs = cached = n = 0
        for c, s in sequences:
            tokens += c
            cached += s
            pairs += s + 1 if c == 1 else flops.attention_pairs(c, s, self.attention)  # a decode: S + 1 keys
            n += 1
        peak = self.hardware.peak_flops_per_s
        num_bytes = self.weight_bytes + (cached + tokens) * self.kv_bytes_per_token
        return StepFeatures(
            linear_s=(tokens * self._linear_flops_per_token + n * self._linear_flops_per_entry) / peak,
            attention_s=pairs * self._attention_flops_per_pair / peak,
            memory_s=num_bytes / self.hardware.memory_bandwidth_bytes_per_s,
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
    def execute(self, batch) -> ExecutionResult:
        """The modelled time of a ``ScheduledBatch`` (read before the engine updates its sequences)."""
        # (new tokens, cached KV tokens): Sequence.num_cached_tokens, inlined (hot in the simulator). A
        # prefix-cache hit is already in num_computed_tokens (ScheduledBatch.add): its tokens are read as
        # cached context, never charged as new (prefilled) tokens.
        seqs = [(e.num_tokens, e.seq.num_computed_tokens - e.seq.num_evicted_tokens) for e in batch.entries]
        evicted = None
        if self.kv_compression_ratio:
            evicted = {}
            for (n, cached), e in zip(seqs, batch.entries, strict=True):
                if e.completes_prefill and not e.is_decode:  # this step ends its prefill
                    evicted[e.seq.seq_id] = int(self.kv_compression_ratio * (cached + n))
        return ExecutionResult(duration_s=self.step_time_s(seqs), next_token_ids=None, evicted_tokens=evicted or None)

    def with_factors(self, factors: CostFactors) -> CostModelExecutor:
        return CostModelExecutor(self.model, self.hardware, factors, self.weight_dtype, self.kv_dtype,
                                 self.attention, self.params, self.kv_compression_ratio)

    def __repr__(self) -> str:
        return f"CostModelExecutor({self.model.name}, {self.hardware.name}, {self.factors})"
