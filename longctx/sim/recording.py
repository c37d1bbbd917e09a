"""Recording what a real engine's steps were: each batch's entries and its measured duration.

``RecordingExecutor`` wraps any executor; the ``MeasuredStep``\\ s it keeps are what
``longctx.sim.calibration.calibrate`` fits the cost model to. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longctx.engine.executor import ExecutionResult


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

    def execute(self, batch) -> ExecutionResult:
        seqs = tuple((e.num_tokens, e.seq.num_cached_tokens) for e in batch.entries)  # (new, cached KV)
        result = self.inner.execute(batch)
        self.steps.append(MeasuredStep(seqs, float(result.duration_s)))
        return result
