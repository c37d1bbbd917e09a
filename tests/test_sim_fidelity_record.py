"""benchmarks/sim_fidelity.py's record (longctx/data/recorded/sim_fidelity.json): made on a quiet machine with
its provenance, self-consistent (each error is the prediction against the median of the real runs; the paired
errors, their t-intervals and the verdicts follow the rule the script states), with the steadiness of the
machine measured,
on the well-conditioned workload B, and saying what the profiled GEMMs changed against the roofline ones."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from longctx.evals.stats import mean_interval
from longctx.sim.gemm_profile import GROUPS, GemmProfile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sim_fidelity  # noqa: E402
import sim_fidelity_analysis  # noqa: E402

RECORD = json.loads((ROOT / "longctx" / "data" / "recorded" / "sim_fidelity.json").read_text())
MODELS = {"profiled GEMMs": RECORD, "roofline GEMMs": RECORD["roofline_gemms"]}
RUNS = json.loads((ROOT / "longctx" / "data" / "recorded" / RECORD["measured_runs"]).read_text())


def test_the_record_carries_its_provenance_and_was_made_quiet():
    assert RECORD["usable"] is True and RECORD["commit"] and not RECORD.get("commit_dirty", False)
    assert {"date", "machine", "torch", "python", "cpu", "calibration"} <= set(RECORD)
    threads = RECORD["cpu"]["torch_threads"]
    assert RECORD["load_average_1min_start"] <= threads
    assert all(r["load_1min_start"] - threads <= threads for r in RECORD["repeats"])  # wait_for_quiet's rule


def test_the_record_is_of_the_workload_the_script_runs():
    assert RECORD["workload_b"] == {"requests": sim_fidelity.B_REQUESTS, "rate_per_s": sim_fidelity.B_RATE,
                                    "budget": 512}
    assert len(RECORD["repeats"]) >= 6  # six pairs of runs: the t-interval has 5 degrees of freedom
    assert RECORD["workload_a"] == {
        "burst": 10,
        "budget": sim_fidelity.A_BUDGET,
        "stair": {
            "requests": sim_fidelity.STAIR_REQUESTS, "start_s": sim_fidelity.STAIR_START_S,
            "gap_s": sim_fidelity.STAIR_GAP_S,
        },
    }
    wl_a, _ = sim_fidelity.workloads()
    first = [st for st in sim_fidelity.steps_from_json(RUNS["a"][0]) if all(n == 1 for n, _ in st.sequences)]
    sizes = {len(st.sequences) for st in first}
    assert len(wl_a) == 10 + sim_fidelity.STAIR_REQUESTS and set(range(1, 6)) <= sizes  # the staircase ran


def test_the_staircase_covers_the_small_decode_batches():
    """Every decode-only batch size 1-5 (what B runs most) ran in each real run of A: 10 steps or more each
    when
    simulated (the rule A was chosen by), 8 or more in every real run (the docstring says 8-24)."""
    for run in RUNS["a"]:
        counts = {}
        for st in sim_fidelity.steps_from_json(run):
            if all(n == 1 for n, _ in st.sequences):
                counts[len(st.sequences)] = counts.get(len(st.sequences), 0) + 1
        assert all(counts.get(k, 0) >= 8 for k in range(1, 6)), counts


def test_the_gemm_profile_is_recorded_whole():
    profile = GemmProfile.from_dict(RECORD["gemm_profile"])
    assert (
        set(profile.seconds) == set(GROUPS)
        and profile.rows[0] == 1
        and profile.rows[-1] >= sim_fidelity.B_BUDGET
    )
    assert "measured" in profile.source


def test_the_machines_steadiness_is_measured_and_the_verdicts_follow_it():
    probes = RECORD["speed_probe_s"]
    assert len(probes) == 3 * len(RECORD["repeats"])  # before each A, before and after each B
    assert RECORD["speed_probe_spread"] == pytest.approx(max(probes) / min(probes) - 1)
    assert RECORD["steady"] == (RECORD["speed_probe_spread"] <= sim_fidelity.STEADY_SPREAD)


@pytest.mark.parametrize("name", MODELS)
def test_each_error_is_the_prediction_against_the_median_run(name):
    rec = MODELS[name]
    assert [r["metric"] for r in rec["rows"]] == list(sim_fidelity.METRICS)
    for row in rec["rows"]:
        runs = [rep["measured_s"][row["metric"]] for rep in rec["repeats"]]
        assert row["measured_s"] == pytest.approx(statistics.median(runs))
        assert row["error"] == pytest.approx(row["predicted_s"] / row["measured_s"] - 1)
        assert row["errors_per_repeat"] == pytest.approx([row["predicted_s"] / m - 1 for m in runs])


@pytest.mark.parametrize("name", MODELS)
def test_the_paired_errors_intervals_and_verdicts_follow_the_stated_rule(name):
    rec = MODELS[name]
    assert rec["paired"] == sim_fidelity_analysis.paired_errors(rec["repeats"], RECORD["steady"])
    for m, row in rec["paired"].items():
        errs = [r["predicted_at_speed_s"][m] / r["measured_s"][m] - 1 for r in rec["repeats"]]
        assert row["errors"] == pytest.approx(errs)
        assert (row["mean"], row["low"], row["high"]) == pytest.approx(mean_interval(errs))


def test_the_calibrations_own_spread_is_recorded():
    for rec in MODELS.values():
        spread = rec["calibration_spread_leave_one_run_out"]  # one refit per run of A left out
        assert set(spread) == set(sim_fidelity.METRICS)
        assert all(len(v) == len(rec["repeats"]) for v in spread.values())


def test_the_targeted_metrics_are_well_conditioned():
    # each moves by at most 3x a 3 % change of every step (the 12-request B moved 7x): its error says
    # something
    # of the cost model, not only of which arrival lands in which step
    for m in sim_fidelity_analysis.TARGETED:
        assert all(abs(c[m]) <= 0.09 for c in RECORD["conditioning"].values()), m


def test_what_the_docstring_says_the_profile_changed():
    """The profiled GEMMs price B's real steps better than the roofline ones (median per-step error) and
    follow
    the decode stair (worst decode-only batch size); the docstring's table quotes both models' errors."""
    prof, roof = RECORD, RECORD["roofline_gemms"]
    assert prof["step_error_median"] < roof["step_error_median"]
    worst = {
        n: max(abs(r["error"]) for r in rec["decode_steps_by_batch"] if r["steps"] >= 100)
        for n, rec in MODELS.items()
    }
    assert worst["profiled GEMMs"] < worst["roofline GEMMs"]
    doc = sim_fidelity.__doc__
    for name, rec in MODELS.items():
        for row in rec["rows"]:
            line = next(x for x in doc.splitlines() if x.strip().startswith(f"{row['metric']} ({name})"))
            assert f"{100 * row['error']:+.1f} %" in line, (row, line)


def test_the_raw_runs_are_the_records():
    assert RUNS["commit"] == RECORD["commit"] and len(RUNS["a"]) == len(RUNS["b"]) == len(RECORD["repeats"])
    for run, rep in zip(RUNS["b"], RECORD["repeats"], strict=True):
        assert run["measured_s"] == rep["measured_s"] and run["repeat"] == rep["repeat"]
    steps_a = [st for run in RUNS["a"] for st in sim_fidelity.steps_from_json(run)]
    assert len(steps_a) == RECORD["calibration"]["num_steps"]


SAVED = sim_fidelity.load_saved(ROOT / "longctx" / "data" / "recorded" / RECORD["measured_runs"])


def _fitted(rec):
    from longctx.sim import CostFactors

    profiled, roofline = sim_fidelity.cost_models(SAVED["hardware"], SAVED["profile"])
    return (profiled if rec is RECORD else roofline).with_factors(
        CostFactors(**rec["calibration"]["factors"])
    )


@pytest.mark.parametrize("name", MODELS)
def test_the_replay_follows_from_the_raw_runs(name):
    """Step 8 recomputed from the saved runs: each run of B replayed with its measured step times."""
    rec = MODELS[name]
    real = SAVED["real_runs"]
    _, wl_b = sim_fidelity.workloads()
    for key, gap in (("replay", 0.0), ("replay_with_host_gap", RECORD["host_gap_s"])):
        again = sim_fidelity_analysis.replay_errors(_fitted(rec), real, wl_b, gap)
        assert again["aligned_runs"] == rec[key]["aligned_runs"]
        for a, b in zip(again["runs"], rec[key]["runs"], strict=True):
            assert (a["replayed"], a["parted_at"], a["steps"]) == (b["replayed"], b["parted_at"], b["steps"])
            assert a["error"] == pytest.approx(b["error"], rel=1e-6, abs=1e-9)


def test_a_replay_that_never_parts_reproduces_the_served_metrics():
    """The schedule is the engine's: where the replay never parts, every metric is within 1 % of the real run;
    the engine's own time between steps (host_gap_s) keeps more replays from parting."""
    plain, gapped = RECORD["replay"], RECORD["replay_with_host_gap"]
    assert 0 < RECORD["host_gap_s"] < 1e-3 and gapped["aligned_runs"] > plain["aligned_runs"] >= 1
    for rep in (plain, gapped):
        assert all(v < 0.01 for v in rep["aligned_worst_abs_error"].values())
