"""Recording what a real engine's steps were: each batch's entries and its measured duration.

``RecordingExecutor`` (and ``ScaledExecutor``, which stretches every step's time, and ``ReplayExecutor``,
which gives each step the measured time of the same step of a real run) wraps any executor and
follows the executor protocol (``WrappedExecutor``): the inner executor's pool, prompt checks and
per-request state (``block_manager``, ``check_prompt``, ``forget``) stay the inner one's, so a wrapped
``TorchExecutor`` still prunes, samples and owns its cache. The ``MeasuredStep``\\ s it keeps
are what ``longctx.sim.calibration.calibrate`` fits the cost model to. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from longctx.engine.executor import ExecutionResult, Executor


@dataclass(frozen=True)
class MeasuredStep:
    """One measured iteration: its entries ``(new_tokens, cached_tokens)`` and its time in seconds."""

    sequences: tuple[tuple[int, int], ...]
    duration_s: float


@dataclass
class WrappedExecutor(Executor):
    """Base of an executor that wraps another: the inner one's pool, prompt checks and per-request state."""

    inner: Executor

    def __post_init__(self) -> None:
        if not isinstance(self.inner, Executor):
            raise ValueError(
                f"{type(self).__name__} wraps a longctx.engine.Executor, got {type(self.inner).__name__}"
            )

    @property
    def block_manager(self):
        return self.inner.block_manager

    def check_prompt(self, num_tokens: int) -> None:
        self.inner.check_prompt(num_tokens)

    def forget(self, seq_id: int) -> None:
        self.inner.forget(seq_id)


@dataclass
class RecordingExecutor(WrappedExecutor):
    """Wraps any executor and records each batch's composition and measured duration (no torch here)."""

    steps: list[MeasuredStep] = field(default_factory=list)

    def execute(self, batch) -> ExecutionResult:
        seqs = step_entries(batch)
        result = self.inner.execute(batch)
        self.steps.append(MeasuredStep(seqs, float(result.duration_s)))
        return result


def step_entries(batch) -> tuple[tuple[int, int], ...]:
    """A batch's entries as ``MeasuredStep.sequences`` holds them: ``(new_tokens, cached_tokens)`` each."""
    return tuple((e.num_tokens, e.seq.num_cached_tokens) for e in batch.entries)


@dataclass
class ReplayExecutor(WrappedExecutor):
    """Replays a real run: while each simulated batch has the entries of the same step of ``measured`` (the
    run's ``MeasuredStep`` list in order), it takes that step's measured time; from the first batch that
    differs (``diverged_at``, its index; None while none has) every step is ``inner``'s. ``parted_at`` also
    counts a simulation that ended before the recording did. An intervention for the simulator: with the cost
    model's error forced off, what is left of a served metric's error is the schedule's
    (``benchmarks/sim_fidelity.py``). One replay per simulated run: its counters are not reset."""

    measured: tuple[MeasuredStep, ...] = ()
    replayed: int = 0
    diverged_at: int | None = None

    def execute(self, batch) -> ExecutionResult:
        result = self.inner.execute(batch)
        i = self.replayed
        if (
            self.diverged_at is None
            and i < len(self.measured)
            and self.measured[i].sequences == step_entries(batch)
        ):
            self.replayed += 1
            return replace(result, duration_s=self.measured[i].duration_s)
        if self.diverged_at is None:
            self.diverged_at = i
        return result

    @property
    def parted_at(self) -> int | None:
        """The first step at which the simulated run and the recorded one differ, a simulation that ended
        early included (its step count); None when every recorded step was replayed and no other ran."""
        if self.diverged_at is not None:
            return self.diverged_at
        return None if self.replayed == len(self.measured) else self.replayed


@dataclass
class ScaledExecutor(WrappedExecutor):
    """Every step of ``inner`` takes ``scale`` times as long (e.g. a cost model 3 % slower): an intervention
    that shows how much a serving metric moves with the step times (``benchmarks/sim_fidelity.py``)."""

    scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.scale, bool) or not (
            isinstance(self.scale, (int, float)) and 0 < self.scale < float("inf")
        ):
            raise ValueError(f"scale must be a finite number > 0, got {self.scale!r}")

    def execute(self, batch) -> ExecutionResult:
        result = self.inner.execute(batch)
        return replace(result, duration_s=result.duration_s * self.scale)
