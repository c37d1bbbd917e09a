"""Fitting the cost model's five step factors to measured step times (weighted least squares; no scipy).

Factors: ``step_overhead_s`` o, ``per_sequence_overhead_s`` p and ``a = 1 / efficiency >= 1`` for compute,
attention and memory, so the fitted model never beats the roofline. Either form of
``CostModelExecutor`` is linear in ``(o, p, a_lin, a_att, a_mem)`` once each bound is known:

- ``"batch"``: ``t = o + p * entries + max(a_lin * linear_s + a_att * attention_s, a_mem * memory_s)``,
  one bound per step;
- ``"operator"``: one bound per operator (``longctx.sim.step_terms.design_row``); its other factors
  (serial fraction, kernel and small-op costs, tile) are held.

The bounds are handled by alternating: assign each step (or operator) to its current bound, solve a
weighted least squares (weights 1/t, so the fit minimises relative error), repeat from three starting
assignments (the current factors', all compute-bound, all memory-bound), keep the best.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from longctx.sim.cost_model import CostFactors, CostModelExecutor
from longctx.sim.factors import FACTOR_NAMES
from longctx.sim.recording import MeasuredStep
from longctx.sim.step_terms import design_row, operator_terms


@dataclass(frozen=True)
class Calibration:
    """Result of ``calibrate``: the fitted factors and how well they fit (relative errors)."""

    factors: CostFactors
    median_abs_rel_error: float
    max_abs_rel_error: float
    num_steps: int
    clipped: tuple[str, ...]  # efficiencies the fit wanted above 1 (the hardware spec's peak is too low)


def bounded_lstsq(
    x_cols: np.ndarray, y: np.ndarray, lower: np.ndarray, fixed: dict[int, float]
) -> np.ndarray:
    """Least squares for y ~ X @ theta with theta >= lower and some entries fixed (active set: clamp,
    re-solve)."""
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


class _Design:
    """The regression rows of a list of steps for a given theta (which sets every bound)."""

    def __init__(self, executor: CostModelExecutor, steps: list[MeasuredStep]) -> None:
        self.form = executor.form
        self.serial = executor.factors.serial_fraction
        if self.form == "batch":
            feats = [executor.features(s.sequences) for s in steps]
            self.cols = np.array(
                [[1.0, f.num_sequences, f.linear_s, f.attention_s, f.memory_s] for f in feats]
            )
        else:
            self.terms = [operator_terms(executor, s.sequences) for s in steps]

    def rows(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(X [n, 5], const [n])`` with ``t = X @ theta + const`` under theta's bounds."""
        if self.form == "batch":
            c = self.cols
            cb = (theta[2] * c[:, 2] + theta[3] * c[:, 3] >= theta[4] * c[:, 4]).astype(float)
            return c * np.c_[np.ones_like(cb), np.ones_like(cb), cb, cb, 1 - cb], np.zeros(len(c))
        rows = [design_row(t, theta, self.serial) for t in self.terms]
        return np.array([r for r, _ in rows]), np.array([k for _, k in rows])

    def predict(self, theta: np.ndarray) -> np.ndarray:
        x, const = self.rows(theta)
        return x @ theta + const


def _alternate(design: _Design, y, start, theta0, fixed, iterations) -> tuple[np.ndarray, float]:
    """From the bounds ``start`` implies: solve, reassign, repeat; the best (theta, loss) seen."""
    w, lower = 1.0 / y, np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    best, best_loss, assign = theta0, np.inf, start
    x_prev = None
    for _ in range(iterations):
        x, const = design.rows(assign)
        if x_prev is not None and np.array_equal(x, x_prev):
            break
        x_prev = x
        fx = dict(fixed)  # a bound with no steps leaves its factors undetermined: keep the current values
        for j in (2, 3, 4):
            if not np.any(x[:, j] > 0):
                fx.setdefault(j, theta0[j])
        theta = bounded_lstsq(x * w[:, None], (y - const) * w, lower, fx)
        loss = float(np.sum(((design.predict(theta) - y) * w) ** 2))
        if loss < best_loss - 1e-15:
            best, best_loss = theta, loss
        assign = theta
    return best, best_loss


def calibrate(
    executor: CostModelExecutor, steps: Sequence[MeasuredStep], fit: Iterable[str] = FACTOR_NAMES,
    iterations: int = 30,
) -> Calibration:
    """Fit ``executor``'s five step factors to measured steps, in the executor's form (module docstring);
    returns a ``Calibration`` (use ``.factors``). Factors not in ``fit`` keep ``executor.factors``' values."""
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
    design = _Design(executor, steps)
    k0 = executor.factors
    cur = np.array([k0.step_overhead_s, k0.per_sequence_overhead_s, 1 / k0.compute_efficiency,
                    1 / k0.attention_efficiency, 1 / k0.memory_efficiency])
    fixed = {j: cur[j] for j, name in enumerate(FACTOR_NAMES) if name not in fit}
    best, best_loss = cur, float(np.sum(((design.predict(cur) - y) / y) ** 2))
    tiny = 1e-12
    # current, all compute, all memory
    starts = [cur, np.r_[cur[:4], tiny], np.r_[cur[:2], tiny, tiny, cur[4]]]
    for start in starts:
        theta, loss = _alternate(design, y, start, cur, fixed, iterations)
        if loss < best_loss - 1e-15:
            best, best_loss = theta, loss
    rel = np.abs(design.predict(best) - y) / y
    values = [float(best[0]), float(best[1]), float(1 / best[2]), float(1 / best[3]), float(1 / best[4])]
    factors = replace(k0, **{n: v for n, v in zip(FACTOR_NAMES, values, strict=True) if n in fit})
    clipped = tuple(n for j, n in enumerate(FACTOR_NAMES) if j >= 2 and n in fit and best[j] <= 1.0 + 1e-12)
    return Calibration(factors, float(np.median(rel)), float(np.max(rel)), len(steps), clipped)
