"""ReplayExecutor: a simulated run given the step times of a recorded run reproduces it, and says where the
schedules part."""

from __future__ import annotations

import pytest

from longctx.engine import ChunkedPrefillScheduler, Engine, VirtualClock, summarize
from longctx.request_metrics import request_metrics
from longctx.sim import (
    CostModelExecutor,
    MeasuredStep,
    RecordingExecutor,
    ReplayExecutor,
    ScaledExecutor,
    make_workload,
)
from longctx.specs import get_hardware

WORKLOAD = make_workload(12, 4.0, 300, 8, seed=3)


def serve(executor):
    engine = Engine(
        executor, ChunkedPrefillScheduler(256), num_blocks=256, block_size=16, clock=VirtualClock(),
        max_model_len=4096,
    )
    for r in WORKLOAD:
        engine.add_request([0] * r.prompt_tokens, r.output_tokens, arrival_s=r.arrival_s)
    finished = engine.run_until_done()
    return summarize([request_metrics(s) for s in finished])


def model():
    return CostModelExecutor("llama-3-8b", get_hardware("h100"))


def test_replaying_a_recorded_run_reproduces_it_under_another_model():
    rec = RecordingExecutor(ScaledExecutor(model(), 3.0))  # the "real" run: every step 3x the model's
    truth = serve(rec)
    replay = ReplayExecutor(model(), tuple(rec.steps))
    again = serve(replay)
    assert replay.diverged_at is None and replay.replayed == len(rec.steps)
    assert again.ttft.median == pytest.approx(truth.ttft.median) and again.itl.p(99) == pytest.approx(
        truth.itl.p(99)
    )
    assert serve(model()).ttft.median < 0.5 * truth.ttft.median  # the inner model alone would be far off


def test_the_replay_says_where_the_schedules_part():
    rec = RecordingExecutor(model())
    serve(rec)
    wrong = list(rec.steps)
    wrong[5] = MeasuredStep(((999, 0),), 1.0)  # a step the simulation will not schedule
    replay = ReplayExecutor(model(), tuple(wrong))
    serve(replay)
    assert replay.diverged_at == replay.parted_at == 5 and replay.replayed == 5
    short = ReplayExecutor(model(), tuple(rec.steps[:3]))  # fewer steps recorded than simulated
    serve(short)
    assert short.diverged_at == 3


def test_a_simulation_that_ends_before_the_recording_has_parted():
    rec = RecordingExecutor(model())
    serve(rec)
    longer = ReplayExecutor(model(), (*rec.steps, MeasuredStep(((1, 9),), 0.5)))  # one step the run never had
    serve(longer)
    assert longer.diverged_at is None and longer.parted_at == len(rec.steps)
    exact = ReplayExecutor(model(), tuple(rec.steps))
    serve(exact)
    assert exact.parted_at is None
