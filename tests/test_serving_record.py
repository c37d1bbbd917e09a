"""benchmarks/serving.py and the record it shipped (longctx/data/recorded/serving_cpu.json): the script
refuses to record on a loaded machine (the house gate, niah_grid.load_gate), the record was made under the
cores it used and carries its provenance, its rows are self-consistent, and lesson 08's prose quotes its
numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import niah_grid  # noqa: E402
import serving  # noqa: E402

RECORD = ROOT / "longctx" / "data" / "recorded" / "serving_cpu.json"
SOLUTION = ROOT / "solutions" / "08_benchmarking_serving" / "08_benchmarking_serving.ipynb"


def test_the_script_refuses_to_record_above_its_cores(monkeypatch, capsys):
    monkeypatch.setattr(niah_grid.os, "getloadavg", lambda: (2.6, 2.0, 1.0))
    with pytest.raises(SystemExit) as stop:
        serving.main(["--threads", "2", "--out", "/nonexistent/never-written.json"])
    assert stop.value.code == 3 and "above the 2 core" in capsys.readouterr().err
    # not copies
    assert serving.load_gate is niah_grid.load_gate and serving.provenance is niah_grid.provenance


def _record():
    return json.loads(RECORD.read_text())


def test_the_record_was_made_on_a_quiet_machine_with_provenance():
    meta = _record()["meta"]
    assert meta["usable"] is True and meta["commit"] and not meta["commit_dirty"]
    threads = meta["torch_threads"]
    assert meta["load_average_1min_start"] <= threads
    assert all(load <= 2 * threads for load in meta["load_average_1min_before_rows"])  # others <= threads
    assert {"date", "machine", "torch", "n", "n_chat_requests", "slo_ttft_s", "slo_itl_s"} <= set(meta)


def test_the_rows_add_up_and_the_schedulers_separate():
    data = _record()
    rows, meta = data["rows"], data["meta"]
    assert meta["n"] == len(rows) == 4 and meta["n_chat_requests"] == sum(r["n_chat_requests"] for r in rows)
    for r in rows:
        assert (r["chat_completed"] == r["n_chat_requests"] == r["num_chat"] * r["repeats"]
                == len(r["chat_worst_gap_ms"]))
        assert len(r["long_ttft_ms"]) == r["num_long"] * r["repeats"] and not r["errors"]
        lo, hi = r["chat_good_wilson95"]
        assert lo <= r["chat_good"] / r["chat_completed"] <= hi
        good = sum(w <= 1000 * meta["slo_itl_s"] for w in r["chat_worst_gap_ms"])
        assert r["chat_good"] <= good  # the worst-gap bound alone already limits the good count
    for load in ("light", "heavy"):
        mono, chunk = (next(r for r in rows if r["load"] == load and r["scheduler"] == s)
                       for s in serving.SCHEDULERS)
        assert chunk["chat_good"] > mono["chat_good"] and chunk["repeats_met"] > mono["repeats_met"]
        # over repeats, the independent unit (3 vs 3: p >= 0.1)
        assert 0 <= meta["fisher_over_repeats"][load] <= 1
        assert max(chunk["chat_worst_gap_ms"]) < min(mono["chat_worst_gap_ms"])
        # chunking costs the long prompt
        assert sorted(chunk["long_ttft_ms"])[-1] > sorted(mono["long_ttft_ms"])[-1]


def test_lesson_08_prose_quotes_the_record():
    rows = {(r["load"], r["scheduler"]): r for r in _record()["rows"]}
    nb = json.loads(SOLUTION.read_text())
    prose = " ".join(" ".join("".join(c["source"]) for c in nb["cells"]
                              if c["cell_type"] == "markdown").split())
    quoted = [
        f"at most {max(rows['light', 'chunked']['chat_worst_gap_ms']):.0f} ms and "
        f"{max(rows['heavy', 'chunked']['chat_worst_gap_ms']):.0f} ms",
        f"{rows['light', 'chunked']['chat_good']}/{rows['light', 'chunked']['chat_completed']} and "
        f"{rows['heavy', 'chunked']['chat_good']}/{rows['heavy', 'chunked']['chat_completed']}",
        f"{rows['light', 'chunked']['chat_itl_ms']['p50']:.0f} against "
        f"{rows['light', 'monolithic']['chat_itl_ms']['p50']:.0f} ms",
        f"{rows['heavy', 'chunked']['chat_itl_ms']['p50']:.0f} against "
        f"{rows['heavy', 'monolithic']['chat_itl_ms']['p50']:.0f}",
        f"p = {_record()['meta']['fisher_over_repeats']['light']:.2g}",
    ]
    for text in quoted:
        assert text in prose, f"lesson 08's prose does not quote the record: {text!r}"


def test_a_row_started_above_the_cores_makes_the_record_unusable():
    assert serving.rows_started_quiet([1.29, 1.71, 1.29, 1.61], 2)
    assert not serving.rows_started_quiet([1.29, 2.4, 1.29], 2), "a row at load 2.4 on 2 threads is not quiet"
    assert all(load <= _record()["meta"]["torch_threads"]
               for load in _record()["meta"]["load_average_1min_before_rows"])
