"""Lesson 07's recorded load test (longctx/data/recorded/capstone_sim.json, written by benchmarks/capstone.py
sim): it fills the pool (every configuration the plan fits ran all 64 users in one step, with no preemption
and within the SLA), the configurations the plan does not fit visibly fail, the record has its provenance, it
is what the code computes today, and the recording script refuses a loaded machine for the sections that time
something (the simulated section does not: it runs on a virtual clock, so it records whatever the load)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from longctx.plan import plan
from longctx.recorded import load_recorded
from longctx.sim.loadtest import CAPSTONE, LoadTest, RegisterAfterStep, run_load_test

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import capstone  # noqa: E402
import niah_grid  # noqa: E402

REC = load_recorded("capstone_sim.json")
ROWS = REC["rows"]


def test_provenance():
    meta = REC["meta"]
    for key in ("commit", "date", "machine", "load_average_1min_start", "n", "cores_used", "load_test"):
        assert meta.get(key) is not None, key
    assert meta["usable"] is True and meta["load_gate"] == capstone.UNGATED["sim"], "simulated: no load gate"
    assert meta["n"] == len(ROWS) == 8
    assert (
        meta["load_test"]["users"] == 64
        and meta["load_test"]["prompt_tokens"] + meta["load_test"]["output_tokens"] == 8192
    )


def test_every_configuration_once():
    assert sorted((r["model"], r["kv_dtype"], r["prefix_caching"]) for r in ROWS) == sorted(capstone.CONFIGS)


@pytest.mark.parametrize(
    "row", ROWS, ids=lambda r: f"{r['model']}-{r['kv_dtype']}-{'prefix' if r['prefix_caching'] else 'none'}"
)
def test_fitting_configurations_hold_64_users_and_the_others_fail(row):
    p = plan(row["model"], row["kv_dtype"], 64, 8192, 2048 if row["prefix_caching"] else 0, pool_gib=48)
    assert (
        row["plan_fits"] is p.fits
        and row["planned_blocks"] == p.blocks
        and row["pool_blocks"] == p.pool_blocks
    )
    assert row["peak_used_blocks"] <= row["pool_blocks"]
    if p.fits:
        assert row["peak_running"] >= 64, "a configuration that fits must hold all 64 users at once"
        assert row["seconds_all_running"] > 5, "... for a while, not one step"
        assert row["preemptions"] == 0 and row["sla_met"] and row["passes"] and not row["failures"]
        assert row["peak_used_blocks"] > 0.98 * row["planned_blocks"], "the test must come close to the plan"
    else:
        assert not row["passes"] and row["failures"]
        assert row["peak_running"] < 64 or row["preemptions"] > 0 or not row["sla_met"]


def test_the_record_is_what_the_code_computes():
    rec = next(
        r for r in ROWS if (r["model"], r["kv_dtype"], r["prefix_caching"]) == ("llama-3-8b", "fp8", True)
    )
    now = run_load_test("llama-3-8b", "fp8", True)
    assert {k: v for k, v in now.items() if k != "wall_s"} == {k: v for k, v in rec.items() if k != "wall_s"}


def test_same_step_sharing_saves_prefill_for_simultaneous_arrivals():
    by = {(r["traffic"], r["same_step_sharing"]): r for r in REC["same_step"]}
    on, off = by[("chat_at_t0", True)], by[("chat_at_t0", False)]
    assert on["prefill_tokens"] < off["prefill_tokens"] and on["ttft_s"]["p50"] < off["ttft_s"]["p50"]
    assert on["peak_used_blocks"] < off["peak_used_blocks"]
    spread_on, spread_off = by[("capstone", True)], by[("capstone", False)]
    assert spread_on["prefill_tokens"] == spread_off["prefill_tokens"], (
        "arrivals 31 ms apart never share a step"
    )


def test_register_after_step_defers_the_hit():
    """The intervention: a second sequence admitted before the first one's step ends misses the prefix."""
    ids = list(range(1, 65))
    for cls, hit in ((RegisterAfterStep, False), (None, True)):
        from longctx.kv.block_manager import BlockManager

        bm = (cls or BlockManager)(16, 16, enable_prefix_caching=True)
        bm.allocate(0, 64)
        bm.cache_full_blocks(0, lambda a, b: ids[a:b], 64)
        assert (bm.cached_prefix(ids + [99]) is not None) is hit
        if cls is not None:
            bm.flush()
            assert bm.cached_prefix(ids + [99]).num_tokens == 64
        bm.check_invariants()


def test_load_test_validates():
    with pytest.raises(ValueError, match="shared_prefix_tokens"):
        LoadTest(prompt_tokens=100, shared_prefix_tokens=100)
    with pytest.raises(ValueError, match="users"):
        LoadTest(users=0)
    assert CAPSTONE.context_tokens == 8192 and len(CAPSTONE.workload()) == 64
    assert CAPSTONE.workload()[-1].arrival_s < CAPSTONE.arrival_window_s


def test_the_script_refuses_a_loaded_machine_for_a_timed_section(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(niah_grid.os, "getloadavg", lambda: (2.5, 1.0, 1.0))
    with pytest.raises(SystemExit) as stop:  # the gate runs before the model is loaded
        capstone.main(["quality", "--out", str(tmp_path / "x.json")])
    assert stop.value.code == 3 and "above the 2 core" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_the_simulated_section_records_on_a_loaded_machine_and_keeps_the_load(monkeypatch, tmp_path):
    """Its result is on a virtual clock: the load cannot change it, so it is recorded (usable) and the load
    kept."""
    monkeypatch.setattr(niah_grid.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    monkeypatch.setattr(capstone, "CONFIGS", [("llama-3-8b", "fp8", True)])
    monkeypatch.setattr(capstone, "_same_step_tests", lambda: {})
    capstone.main(["sim", "--out", str(tmp_path / "x.json")])
    data = json.loads((tmp_path / "x.json").read_text())
    assert data["meta"]["usable"] is True and data["meta"]["load_average_1min_start"] == 1.5
    assert data["meta"]["load_gate"] == capstone.UNGATED["sim"]
    assert data["rows"][0]["peak_running"] == 64
    assert set(capstone.UNGATED) == {"bytes", "sim"}
