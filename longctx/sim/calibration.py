"""Fitting the cost model's five factors to measured step times (weighted least squares; no scipy).

Model: ``t = o + p * entries + max(a_lin * linear_s + a_att * attention_s, a_mem * memory_s)`` with
``a = 1 / efficiency >= 1`` and ``o, p >= 0``, so the fitted model never beats the roofline. The max is
handled by alternating: assign each step to its current bound, solve a weighted least squares (weights
1/t, so the fit minimises relative error), repeat from three starting assignments, keep the best.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from longctx.sim.cost_model import FACTOR_NAMES, CostFactors, CostModelExecutor
from longctx.sim.recording import MeasuredStep


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


def _columns(executor: CostModelExecutor, steps: list[MeasuredStep]) -> np.ndarray:
    """Regressors per step: ``[1, entries, linear_s, attention_s, memory_s]`` (ideal times), ``[n, 5]``."""
    feats = [executor.features(s.sequences) for s in steps]
    return np.array([[1.0, f.num_sequences, f.linear_s, f.attention_s, f.memory_s] for f in feats])


def _predict(theta: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``o + p*entries + max(a_lin*linear_s + a_att*attention_s, a_mem*memory_s)`` per step."""
    compute = theta[2] * cols[:, 2] + theta[3] * cols[:, 3]
    return theta[0] + theta[1] * cols[:, 1] + np.maximum(compute, theta[4] * cols[:, 4])


def _alternate(cols, y, start_bound, theta0, fixed, iterations) -> tuple[np.ndarray, float]:
    """From one assignment of steps to bounds: solve, reassign, repeat; the best (theta, loss) seen."""
    w, lower = 1.0 / y, np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    best, best_loss, compute_bound = theta0, np.inf, start_bound
    for _ in range(iterations):
        cb = compute_bound.astype(float)
        x = cols * np.c_[np.ones_like(cb), np.ones_like(cb), cb, cb, 1 - cb]  # [n, 5]: the bound's terms only
        fx = dict(fixed)  # a bound with no steps leaves its factors undetermined: keep the current values
        for j in (2, 3, 4):
            if not np.any(x[:, j] > 0):
                fx.setdefault(j, theta0[j])
        theta = _fit_branch(x * w[:, None], y * w, lower, fx)
        loss = float(np.sum(((_predict(theta, cols) - y) * w) ** 2))
        if loss < best_loss - 1e-15:
            best, best_loss = theta, loss
        new_bound = theta[2] * cols[:, 2] + theta[3] * cols[:, 3] >= theta[4] * cols[:, 4]
        if np.array_equal(new_bound, compute_bound):
            break
        compute_bound = new_bound
    return best, best_loss


def calibrate(
    executor: CostModelExecutor,
    steps: Sequence[MeasuredStep],
    fit: Iterable[str] = FACTOR_NAMES,
    iterations: int = 30,
) -> Calibration:
    """Fit ``executor``'s factors to measured steps (module docstring); returns a ``Calibration`` (use
    ``.factors``). Factors not in ``fit`` keep ``executor.factors``' values."""
    fit = tuple(fit)
    for name in fit:
        if name not in FACTOR_NAMES:
            raise ValueError(f"unknown factor {name!r}; allowed: {', '.join(FACTOR_NAMES)}")
    steps = list(steps)
    if len(steps) < 2:
        raise ValueError(f"calibrate needs at least 2 measured steps, got {len(steps)}")
    y = np.array([s.duration_s for s in steps], dtype=float)
    if np.any(y <= 0):
        raise ValueError("measured step durations must be > 0")
    cols = _columns(executor, steps)
    k0 = executor.factors
    cur = np.array([k0.step_overhead_s, k0.per_sequence_overhead_s, 1 / k0.compute_efficiency,
                    1 / k0.attention_efficiency, 1 / k0.memory_efficiency])
    fixed = {j: cur[j] for j, name in enumerate(FACTOR_NAMES) if name not in fit}
    best, best_loss = cur, float(np.sum(((_predict(cur, cols) - y) / y) ** 2))
    starts = [cur[2] * cols[:, 2] + cur[3] * cols[:, 3] >= cur[4] * cols[:, 4],  # the current model's bounds
              np.ones(len(y), bool), np.zeros(len(y), bool)]  # all compute-bound, all memory-bound
    for start in starts:
        theta, loss = _alternate(cols, y, start, cur, fixed, iterations)
        if loss < best_loss - 1e-15:
            best, best_loss = theta, loss
    rel = np.abs(_predict(best, cols) - y) / y
    values = [float(best[0]), float(best[1]), float(1 / best[2]), float(1 / best[3]), float(1 / best[4])]
    factors = replace(k0, **{n: v for n, v in zip(FACTOR_NAMES, values, strict=True) if n in fit})
    clipped = tuple(n for j, n in enumerate(FACTOR_NAMES) if j >= 2 and n in fit and best[j] <= 1.0 + 1e-12)
    return Calibration(factors, float(np.median(rel)), float(np.max(rel)), len(steps), clipped)
