"""benchmarks/sim_fidelity.py's record (longctx/data/recorded/sim_fidelity.json): made on a quiet machine with its
provenance, self-consistent (each error is the prediction against the median of the real runs), on the
well-conditioned workload B, and within the issue-26 target on the two metrics it targets."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sim_fidelity  # noqa: E402

RECORD = json.loads((ROOT / "longctx" / "data" / "recorded" / "sim_fidelity.json").read_text())


def test_the_record_carries_its_provenance_and_was_made_quiet():
    assert RECORD["usable"] is True and RECORD["commit"] and not RECORD.get("commit_dirty", False)
    assert {"date", "machine", "torch", "python", "cpu", "calibration"} <= set(RECORD)
    threads = RECORD["cpu"]["torch_threads"]
    assert RECORD["load_average_1min_start"] <= threads
    assert all(r["load_1min_start"] - threads <= threads for r in RECORD["repeats"])  # wait_for_quiet's rule


def test_the_record_is_of_the_workload_the_script_runs():
    assert RECORD["workload_b"] == {"requests": sim_fidelity.B_REQUESTS, "rate_per_s": sim_fidelity.B_RATE,
                                    "budget": 512}
    assert len(RECORD["repeats"]) >= 3  # the errors are of a median of real runs


def test_each_error_is_the_prediction_against_the_median_run():
    assert [r["metric"] for r in RECORD["rows"]] == list(sim_fidelity.METRICS)
    for row in RECORD["rows"]:
        runs = [rep["measured_s"][row["metric"]] for rep in RECORD["repeats"]]
        assert row["measured_s"] == pytest.approx(statistics.median(runs))
        assert row["error"] == pytest.approx(row["predicted_s"] / row["measured_s"] - 1)
        assert row["errors_per_repeat"] == pytest.approx([row["predicted_s"] / m - 1 for m in runs])


def test_the_calibrations_own_spread_is_recorded():
    spread = RECORD["calibration_spread_leave_one_run_out"]  # one refit per run of A left out
    assert set(spread) == set(sim_fidelity.METRICS)
    assert all(len(v) == len(RECORD["repeats"]) for v in spread.values())


def test_the_targeted_metrics_as_far_as_the_evidence_goes():
    """P99 ITL: within 5 % (six measurements of six, the script's docstring). Median TTFT: within 5 % in four of
    six, so the record is held to what all six support, 10 %; both metrics well-conditioned."""
    bound = {"P99 ITL": 0.05, "median TTFT": 0.10}
    for row in RECORD["rows"]:
        if row["metric"] in sim_fidelity.TARGETED:
            assert abs(row["error"]) <= bound[row["metric"]], row
            # the metric moves by at most 3x a 3 % change of every step (the 12-request B moved 7x): its error
            # says something of the cost model, not only of which arrival lands in which step
            assert all(abs(c[row["metric"]]) <= 0.09 for c in RECORD["conditioning"].values()), row


def test_the_docstring_quotes_the_record():
    doc = sim_fidelity.__doc__
    for row in RECORD["rows"]:
        if row["metric"] in sim_fidelity.TARGETED:
            table_row = next(line for line in doc.splitlines() if line.strip().startswith(row["metric"]))
            assert f"{100 * row['error']:+.1f}" in table_row.split("%")[0].split()[-1:], (row, table_row)
