"""Calibration: the cost model's factors fitted on measurements, with the fit's error stated.

Two kinds of measurement:

- **Published H100 operator profiles** (Vidur's, ``longctx.sim.profiles``): ``fit_profiles`` fits the
  operator form's GEMM factors (``compute_efficiency``, ``memory_efficiency``, ``serial_fraction``,
  ``kernel_overhead_s``; tile and wave quantization held, ``longctx.sim.operators``) on every profiled GEMM,
  each point's relative error weighted by its share of its layer's four GEMMs (so the loss is the layer's
  relative error, what ``linear_time_s`` is judged by), and the small ops' ``elementwise_efficiency`` and
  ``elementwise_overhead_s`` on every profiled norm, RoPE, activation and residual add by relative error
  (the embedding, one lookup per step, is left out). ``profile_errors`` compares the
  modelled ``linear_time_s`` with the measured linear time, per model, TP degree and token range;
  ``leave_one_model_out`` fits on all models but one and reports the error on that one. The simulator's
  H100 defaults (``longctx.sim.factors.FITTED_H100``) are ``fit_profiles()``'s result.
- **Measured engine steps** (``longctx.sim.recording``): ``calibrate`` (``longctx.sim.step_fit``) fits
  the five step factors, e.g. to the real engine on this CPU or to a GPU record.

**Is the form the limit, or the fit?** ``benchmarks/sim_profiles.py`` answers it (its ``search_factors``
searches the four GEMM factors over a grid for the issue's own criterion; the least-squares fit here stayed).

The GEMM fit: for a fixed serial fraction the time is linear in ``(kernel_overhead_s, 1/ce, 1/me)`` once
each point's bound is known, so bounds and a bounded least squares alternate (as in ``step_fit``); the
serial fraction is searched on a grid, then refined. numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from longctx.sim.cost_model import CostFactors
from longctx.sim.factors import GEMM_TILE_TOKENS, GEMM_WAVE_SMS
from longctx.sim.operators import gemm_dims, gemm_tile_area, layers_time_s
from longctx.sim.profiles import GEMM_OPS, SMALL_OPS, ProfiledModel, load_profiles
from longctx.sim.step_fit import Calibration, bounded_lstsq, calibrate
from longctx.specs import HardwareSpec, get_hardware

GOLDEN = (5 ** 0.5 - 1) / 2
TOKEN_RANGES = ((1, 63), (64, 512), (513, 4096))
_GEMM_OF_OP = dict(zip(GEMM_OPS, ("qkv", "o", "gate_up", "down"), strict=True))
WEIGHT_BYTES = ACT_BYTES = 2.0  # Vidur profiles bf16/fp16 models


@dataclass(frozen=True)
class ProfileFit:
    """``fit_profiles``' result: ``factors`` (the fitted fields set, the rest ``CostFactors()``'s) and the
    per-operator relative errors of the fit (root mean square, worst) over its points."""

    factors: CostFactors
    models: tuple[str, ...]
    num_gemm_points: int
    num_small_points: int
    gemm_rms_rel_error: float
    small_rms_rel_error: float
    clipped: tuple[str, ...]  # efficiencies the fit wanted above 1


@dataclass(frozen=True)
class ProfileError:
    """Linear-time error of one model at one TP degree over one token range: ``predicted / measured - 1``."""

    model: str
    tp: int
    low_tokens: int
    high_tokens: int
    num_points: int
    median_abs_error: float
    worst_error: float  # signed, the largest |error|
    worst_at_tokens: int
    over_15_percent: tuple[int, ...]  # token counts where |error| > 15 %


def _points(models: Sequence[ProfiledModel]):
    """Arrays over every profiled GEMM point ``(n, k, m, seconds, share)`` (share: of its layer's four GEMMs
    at that point) and small-op point ``(bytes, seconds)``."""
    g, s = [], []
    for pm in models:
        for tp in pm.tp_degrees:
            ns = pm.num_tokens[tp]
            dims = gemm_dims(pm.shape, tp)
            share = [sum(x) for x in zip(*(pm.op_s(tp, op) for op in GEMM_OPS), strict=True)]  # layer GEMMs
            for op in GEMM_OPS:
                k, m = dims[_GEMM_OF_OP[op]]
                g += [(n, k, m, t, t / tot) for n, t, tot in zip(ns, pm.op_s(tp, op), share, strict=True)]
            per_token = _small_bytes_per_token(pm, tp)
            for op in SMALL_OPS:
                if not pm.op_s(tp, op):
                    continue  # phi-2's parallel block has no post-attention norm
                s += [(n * per_token[op], t) for n, t in zip(ns, pm.op_s(tp, op), strict=True)]
    return np.array(g, dtype=float), np.array(s, dtype=float)


def _small_bytes_per_token(pm: ProfiledModel, tp: int) -> dict[str, float]:
    sh, b = pm.shape, ACT_BYTES
    return {"input_layernorm": 2 * sh.d_model * b, "post_attention_layernorm": 2 * sh.d_model * b,
            "attn_rope": 2 * (sh.num_heads + sh.num_kv_heads) * sh.head_dim / tp * b,
            "mlp_act": (3 if sh.gated_mlp else 2) * sh.intermediate_size / tp * b, "add": 3 * sh.d_model * b}


def _bounded_normal(gram: np.ndarray, rhs: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """Least squares from its normal equations ``gram @ theta = rhs`` with ``theta >= lower`` (active set)."""
    k = len(rhs)
    clamp: dict[int, float] = {}
    for _ in range(k + 1):
        free = [j for j in range(k) if j not in clamp]
        sol = np.array([clamp.get(j, 0.0) for j in range(k)])
        if free:
            held = list(clamp)
            r = rhs[free] - (gram[np.ix_(free, held)] @ sol[held] if held else 0.0)
            sol[free] = np.linalg.lstsq(gram[np.ix_(free, free)], r, rcond=None)[0]
        bad = [j for j in free if sol[j] < lower[j]]
        if not bad:
            return sol
        worst = min(bad, key=lambda j: sol[j] - lower[j])
        clamp[worst] = lower[worst]
    return np.maximum(sol, lower)


def _fit_gemms(pts: np.ndarray, area: np.ndarray, hw: HardwareSpec, serial: float, iterations: int = 30):
    """Best ``(theta = [kernel_overhead_s, 1/ce, 1/me], loss)`` for one serial fraction; ``area``: each
    point's computed output elements (``gemm_tile_area``: whole tiles in whole waves). Each point's relative
    error counts by its share of its layer's GEMM time: the loss is the layers' relative error."""
    n, k, m, y, share = pts.T
    w = share / y
    c = 2.0 * k * area / hw.peak_flops_per_s * w
    mem = (WEIGHT_BYTES * k * m + ACT_BYTES * n * (k + m)) / hw.memory_bandwidth_bytes_per_s * w
    lower, ones = np.array([0.0, 1.0, 1.0]), share

    def rows(theta):
        cb = theta[1] * c >= theta[2] * mem
        return np.c_[w, c * np.where(cb, 1.0, serial), mem * np.where(cb, serial, 1.0)]

    best, best_loss = None, np.inf
    for start in (np.array([0.0, 1.3, 1.1]), np.array([0.0, 1.0, 1e-9]), np.array([0.0, 1e-9, 1.0])):
        theta = start
        for _ in range(iterations):
            x = rows(theta)
            new = _bounded_normal(x.T @ x, x.T @ ones, lower)
            loss = float(np.sum((rows(new) @ new - share) ** 2))
            if loss < best_loss - 1e-15:
                best, best_loss = new, loss
            if np.allclose(new, theta, rtol=1e-12, atol=0):
                break
            theta = new
    return best, best_loss


def fit_profiles(models: Sequence[str] | None = None, hardware: HardwareSpec | str = "h100",
                 tile_tokens: int = GEMM_TILE_TOKENS, wave_sms: int = GEMM_WAVE_SMS) -> ProfileFit:
    """Fit the operator form's GEMM and small-op factors on the profiles of ``models`` (default: all
    shipped) for ``hardware``'s datasheet peak and bandwidth; ``tile_tokens`` and ``wave_sms`` are held
    (module docstring)."""
    table, names = load_profiles(), profiled_names(models)
    hw = get_hardware(hardware)
    gpts, spts = _points([table[x] for x in names])
    area = np.array([gemm_tile_area(int(n), m, tile_tokens, wave_sms) for n, _, m, _, _ in gpts])
    grid = np.linspace(0.0, 1.0, 11)
    losses = [_fit_gemms(gpts, area, hw, s)[1] for s in grid]
    i = int(np.argmin(losses))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]

    def loss_of(serial: float) -> float:
        return _fit_gemms(gpts, area, hw, serial)[1]

    a, b = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fa, fb = loss_of(a), loss_of(b)
    for _ in range(16):  # golden-section refinement of the serial fraction: one new fit per step
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - GOLDEN * (hi - lo)
            fa = loss_of(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + GOLDEN * (hi - lo)
            fb = loss_of(b)
    serial = round(float((lo + hi) / 2), 4)
    theta, _ = _fit_gemms(gpts, area, hw, serial)
    bts, ys = spts.T
    sx = np.c_[np.ones_like(bts), bts / hw.memory_bandwidth_bytes_per_s] / ys[:, None]
    s_theta = bounded_lstsq(sx, np.ones_like(ys), np.array([0.0, 1.0]), {})
    factors = replace(
        CostFactors(), compute_efficiency=_sig(1 / theta[1]), memory_efficiency=_sig(1 / theta[2]),
        serial_fraction=serial, kernel_overhead_s=_sig(theta[0]), elementwise_efficiency=_sig(1 / s_theta[1]),
        elementwise_overhead_s=_sig(s_theta[0]), gemm_tile_tokens=tile_tokens, gemm_wave_sms=wave_sms,
    )
    clipped = tuple(name for name, v in (("compute_efficiency", theta[1]), ("memory_efficiency", theta[2]),
                                         ("elementwise_efficiency", s_theta[1])) if v <= 1 + 1e-12)
    n, k, m, y, _ = gpts.T
    comp = theta[1] * 2.0 * k * area / hw.peak_flops_per_s
    mem = theta[2] * (WEIGHT_BYTES * k * m + ACT_BYTES * n * (k + m)) / hw.memory_bandwidth_bytes_per_s
    rel = (theta[0] + np.maximum(comp, mem) + serial * np.minimum(comp, mem)) / y - 1.0
    return ProfileFit(factors, names, len(gpts), len(spts), float(np.sqrt(np.mean(rel ** 2))),
                      float(np.sqrt(np.mean((sx @ s_theta - 1) ** 2))), clipped)


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{float(x):.{digits}g}")


def profiled_names(models: Sequence[str] | None) -> tuple[str, ...]:
    """``models`` (default: every shipped profile) checked against the shipped profiles."""
    table = load_profiles()
    names = tuple(table) if models is None else tuple(models)
    unknown = [x for x in names if x not in table]
    if unknown or not names:
        raise ValueError(f"unknown profiled models {unknown}; allowed: {', '.join(table)}")
    return names


def _profiled(model: str) -> ProfiledModel:
    """The shipped profile of ``model``, or ``ValueError`` naming the profiled models."""
    pm = load_profiles().get(model)
    if pm is None:
        raise ValueError(f"unknown profiled model {model!r}; allowed: {', '.join(load_profiles())}")
    return pm


def linear_time_points(model: str, tp: int = 1, factors: CostFactors | None = None,
                       hardware: HardwareSpec | str = "h100") -> list[tuple[int, float, float]]:
    """``(num_tokens, measured_s, predicted_s)`` of a profiled model's linear time at every token count."""
    pm = _profiled(model)
    k, hw = factors or CostFactors(), get_hardware(hardware)
    measured = pm.linear_time_s(tp)
    sh = pm.shape  # its own op set: the ModelSpec counts its norms; two residual adds in both
    return [(n, meas, layers_time_s(sh, n, k, hw.peak_flops_per_s, hw.memory_bandwidth_bytes_per_s,
                                    WEIGHT_BYTES, ACT_BYTES, tp))
            for n, meas in zip(pm.num_tokens[tp], measured, strict=True)]


def profile_errors(factors: CostFactors | None = None, models: Sequence[str] | None = None,
                   tps: Sequence[int] | None = None, ranges=TOKEN_RANGES) -> list[ProfileError]:
    """``ProfileError`` rows of ``factors`` (default ``CostFactors()``) per model, TP degree and token
    range."""
    table = load_profiles()
    out = []
    for name in models or tuple(table):
        for tp in tps or table[name].tp_degrees:
            if tp not in table[name].num_tokens:
                continue
            pts = linear_time_points(name, tp, factors)
            for lo, hi in ranges:
                sel = [(n, p / m - 1) for n, m, p in pts if lo <= n <= hi]
                if not sel:
                    continue
                errs = np.array([e for _, e in sel])
                w = int(np.argmax(np.abs(errs)))
                out.append(
                    ProfileError(
                        name, tp, lo, hi, len(sel), float(np.median(np.abs(errs))), float(errs[w]), sel[w][0],
                        tuple(n for n, e in sel if abs(e) > 0.15),
                    )
                )
    return out


def monotone_error_bound(
    model: str, tp: int = 1, low_tokens: int = 64, high_tokens: int = 4096
) -> tuple[float, int, int]:
    """The smallest worst-case relative error that *any* model whose time never falls as tokens are added can
    reach on ``model``'s measured linear time over ``low_tokens ... high_tokens``, and the pair of token
    counts ``(a, b)``, ``a < b``, that forces it: ``(t_a - t_b) / (t_a + t_b)`` for the measured ``t_a >
    t_b``.

    A non-decreasing ``f`` within ``e`` of both needs ``t_a (1 - e) <= f(a) <= f(b) <= t_b (1 + e)``; the
    largest such pair sets the bound, and it is reached (isotonic minimax). The operator form is
    non-decreasing in the token count, so no choice of its factors beats this; ``(0.0, 0, 0)`` when the
    measurement never falls.
    """
    pm = _profiled(model)
    if tp not in pm.num_tokens:
        raise ValueError(f"{model} has no profile at TP {tp}; profiled: {', '.join(map(str, pm.tp_degrees))}")
    pts = [
        (n, t)
        for n, t in zip(pm.num_tokens[tp], pm.linear_time_s(tp), strict=True)
        if low_tokens <= n <= high_tokens
    ]
    best, pair, low_after = 0.0, (0, 0), None
    for n, t in reversed(pts):  # walk down the token counts, keeping the smallest later time
        if low_after is not None and (gap := (t - low_after[1]) / (t + low_after[1])) > best:
            best, pair = gap, (n, low_after[0])
        if low_after is None or t < low_after[1]:
            low_after = (n, t)
    return float(best), int(pair[0]), int(pair[1])


def leave_one_model_out(
    tps: Sequence[int] | None = None, ranges=TOKEN_RANGES
) -> dict[str, tuple[ProfileFit, list[ProfileError]]]:
    """For each profiled model: the fit on all the others and its errors on the one left out."""
    names = tuple(load_profiles())
    return {held: (fit := fit_profiles([x for x in names if x != held]),
                   profile_errors(fit.factors, [held], tps, ranges)) for held in names}


__all__ = [
    "Calibration", "ProfileError", "ProfileFit", "TOKEN_RANGES", "calibrate", "fit_profiles",
    "leave_one_model_out", "linear_time_points", "monotone_error_bound", "profile_errors", "profiled_names",
]
