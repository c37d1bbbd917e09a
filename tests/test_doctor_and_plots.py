"""`python -m longctx doctor` reports honestly without crashing; plot helpers draw labelled axes."""

import json
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import pytest  # noqa: E402

from longctx.engine.step_records import StepRecord  # noqa: E402
from longctx.plots import plot_iteration_timeline, plot_roofline, plot_token_gaps  # noqa: E402


def test_doctor_prints_every_check_as_json():
    result = subprocess.run(
        [sys.executable, "-m", "longctx", "doctor", "--json"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    names = {c["name"] for c in json.loads(result.stdout)}
    assert {"python", "torch", "model file", "model cache", "cuda", "attention backend", "memory"} <= names
    assert result.stderr == ""


def test_unknown_command_is_one_line_on_stderr():
    result = subprocess.run(
        [sys.executable, "-m", "longctx", "no-such-command"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_roofline_places_points_and_labels_units():
    ax = plot_roofline(989e12, 3.35e12, [("decode", 1.0), ("prefill", 2000.0)])
    assert "FLOPs per byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    with pytest.raises(ValueError, match="positive"):
        plot_roofline(0, 3.35e12)


def test_timeline_and_gaps():
    records = [
        StepRecord.at(0.0, 0.02, 0, 4), StepRecord.at(0.02, 1.0, 1000, 0), StepRecord.at(1.02, 0.05, 64, 4),
    ]
    assert [r.kind for r in records] == ["decode", "prefill", "mixed"]
    ax = plot_iteration_timeline(records)
    assert ax.get_xlabel() == "time (ms)"
    ax = plot_token_gaps([0.02, 1.04, 1.07])
    assert "inter-token latency" in ax.get_ylabel()


def test_timeline_draws_engine_history_directly():
    from longctx.engine import ChunkedPrefillScheduler
    from longctx.lessons.policy_checks import chat_plus_long_prompts, run_policy

    engine, _ = run_policy(ChunkedPrefillScheduler(64), chat_plus_long_prompts())
    origin = engine.history[0].start_s
    ax = plot_iteration_timeline(engine.history, origin_s=origin, time_unit="s")
    kinds = {t.get_text() for t in ax.get_legend().get_texts()}
    assert kinds == {"prefill", "mixed", "decode"}
    first_bar = ax.collections[0].get_paths()[0].vertices[:, 0]
    assert min(first_bar) == 0.0
