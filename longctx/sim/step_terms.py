"""A step's operator-form cost split into the terms each factor scales (for breakdowns and for fits).

``CostModelExecutor(form="operator")`` prices a step as (``longctx.sim.cost_model``)::

    step_s = o + p * E + sum_i [k + max(A c_i, B m_i) + s * min(A c_i, B m_i)]    # GEMMs, all layers
                       + max(A_att c_att, B m_att) + fixed_s                       # attention; small ops

with ``A = 1 / compute_efficiency``, ``B = 1 / memory_efficiency``, ``A_att = 1 / attention_efficiency``,
``c_i`` and ``m_i`` each GEMM's ideal compute and memory seconds (``L`` layers of QKV, O, gate+up, down, and
the LM head over one row per entry), ``k`` the kernel overhead and ``s`` the serial fraction. Once each
operator's bound is known the step time is *linear* in ``(o, p, A, A_att, B)``: ``design_row`` writes that
row, which is how ``longctx.sim.step_fit.calibrate`` fits the operator form by alternating bounds and
least squares. numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from longctx.sim.factors import StepBreakdown
from longctx.sim.operators import gemm_dims, gemm_ideal_s, lm_head_rows, small_ops_time_s


@dataclass(frozen=True)
class OperatorTerms:
    """Ideal (efficiency 1) parts of one step in the operator form, in seconds (module docstring)."""

    gemm_compute_s: np.ndarray  # [g]: each GEMM kind over all layers (the LM head once)
    gemm_memory_s: np.ndarray  # [g]
    attention_compute_s: float
    attention_memory_s: float
    fixed_s: float  # kernel overheads and small ops: not scaled by the five step factors
    num_sequences: int


def operator_terms(ex, sequences: Iterable[tuple[int, int]]) -> OperatorTerms:
    """``OperatorTerms`` of a step on ``ex`` (a ``CostModelExecutor`` with ``form="operator"``)."""
    k, hw, s = ex.factors, ex.hardware, ex.model
    peak, bw = hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s
    if ex.gemm_profile is not None:  # measured parts fixed; only the modelled entries' attention is fitted
        fixed, attended, tokens, n = ex.profiled_parts(sequences)
        parts = []
    else:
        attended = list(sequences)
        tokens, n = sum(c for c, _ in attended), len(attended)
        fixed = small_ops_time_s(s, tokens, k, bw, ex.act_elem_bytes)
        parts = [(tokens, kk, mm, s.num_layers) for kk, mm in gemm_dims(s, 1).values()]
        if lm_head_rows(s) and n:
            parts.append((n, s.d_model, lm_head_rows(s), 1))
    att_tokens, pairs, cached, _ = ex.totals(attended)
    attention_flops, kv_bytes = ex.attention_work(att_tokens, pairs, cached)
    ideal = [(reps, *gemm_ideal_s(rows, kk, mm, k.gemm_tile_tokens, peak, bw, ex.weight_elem_bytes,
                                  ex.act_elem_bytes, k.gemm_wave_sms)) for rows, kk, mm, reps in parts]
    return OperatorTerms(
        gemm_compute_s=np.array([r * c for r, c, _ in ideal]),
        gemm_memory_s=np.array([r * m for r, _, m in ideal]), attention_compute_s=attention_flops / peak,
        attention_memory_s=kv_bytes / bw, fixed_s=fixed + k.kernel_overhead_s * sum(r for r, _, _ in ideal),
        num_sequences=n,
    )


def design_row(t: OperatorTerms, theta: np.ndarray, serial_fraction: float) -> tuple[np.ndarray, float]:
    """``(row, const)`` with ``step_s = row @ (o, p, A, A_att, B) + const`` for the bounds ``theta``
    implies."""
    a, a_att, b = theta[2], theta[3], theta[4]
    cb = a * t.gemm_compute_s >= b * t.gemm_memory_s  # [g]: compute-bound GEMMs
    g = serial_fraction
    lin = float(np.sum(t.gemm_compute_s * np.where(cb, 1.0, g)))
    mem = float(np.sum(t.gemm_memory_s * np.where(cb, g, 1.0)))
    att_cb = a_att * t.attention_compute_s >= b * t.attention_memory_s
    att = t.attention_compute_s if att_cb else 0.0
    mem += 0.0 if att_cb else t.attention_memory_s
    return np.array([1.0, t.num_sequences, lin, att, mem]), t.fixed_s


def operator_breakdown(ex, sequences: Iterable[tuple[int, int]]):
    """``StepBreakdown`` of the operator form: each side summed over the operators, the exact time."""
    seqs = list(sequences)
    t, k = operator_terms(ex, seqs), ex.factors
    compute_s = (
        float(np.sum(t.gemm_compute_s)) / k.compute_efficiency
        + t.attention_compute_s / k.attention_efficiency
    )
    memory_s = float(np.sum(t.gemm_memory_s) + t.attention_memory_s) / k.memory_efficiency
    overhead_s = k.step_overhead_s + k.per_sequence_overhead_s * t.num_sequences
    return StepBreakdown(compute_s, memory_s, overhead_s, ex.step_time_s(seqs) - overhead_s)
