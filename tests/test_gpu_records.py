"""GPU records: their schema (``GpuRecord``, pydantic) checked on load and save, one loader behaviour
(ValueError naming each field at fault), and the device key that names the file."""

import json

import pytest
from gpu_fixtures import small_record

from longctx.gpu.records import (
    check_record,
    describe,
    device_key,
    load_record,
    load_serving,
    record_path,
    save_record,
)


def test_save_and_load_round_trip(tmp_path):
    rec = small_record()
    path = save_record(rec, tmp_path / "h200.json")
    assert load_record(path=path) == json.loads(json.dumps(rec))
    assert describe(rec) == "NVIDIA H200, 2026-01-01"
    assert describe({**rec, "toy": True}).endswith(", toy run")


@pytest.mark.parametrize("change,match", [
    (lambda r: r.pop("ceilings"), "ceilings: Field required"),
    (lambda r: r.update(schema="longctx.gpu/1"),
     "schema: Input should be 'longctx.gpu/2', got 'longctx.gpu/1'"),
    (lambda r: r.update(date="yesterday"), "date: Input should be a valid datetime"),
    (lambda r: r["ceilings"]["copy"].update(bytes_per_s=0),
     r"ceilings.copy.bytes_per_s: Input should be greater than 0, got 0"),
    (lambda r: r["device"].pop("key"), "device.key: Field required"),
    (lambda r: r["decode"][1].pop("step_s"), r"decode\[1\].step_s: Field required"),
    (lambda r: r["attention_share"][0].update(flop_share=60),
     r"attention_share\[0\].flop_share: .* less than or equal to 1"),
    (lambda r: r["prefill_chunks"][0]["chunks"][0].pop(), r"prefill_chunks\[0\].chunks\[0\]"),
])
def test_a_broken_record_says_what_is_wrong(change, match, tmp_path):
    rec = small_record()
    change(rec)
    with pytest.raises(ValueError, match=r"^not a valid GPU record \(longctx.gpu/2\): " + match):
        check_record(rec)
    with pytest.raises(ValueError, match="not a valid GPU record"):
        save_record(rec, tmp_path / "new" / "h200.json")
    assert not (tmp_path / "new").exists()  # checked before anything is written


def test_keys_it_does_not_name_are_kept():
    rec = {**small_record(), "notes": "free text", "wall_s": 12.5}
    assert check_record(rec) is rec and describe(rec) == "NVIDIA H200, 2026-01-01"


def test_absent_and_invalid_files_raise(tmp_path):
    with pytest.raises(ValueError, match="no recorded result 'no-such-gpu.json'"):
        load_record("no-such-gpu")
    assert not record_path("no-such-gpu").is_file()
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_record(path=tmp_path / "bad.json")


@pytest.mark.parametrize("name,key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu"),
                                      ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"), ("Tesla T4", "t4")])
def test_device_key(name, key):
    assert device_key(name) == key


def test_the_shipped_h200_record_names_the_measured_tree():
    rec = load_record("h200")
    assert rec["toy"] is False and rec["device"]["name"] == "NVIDIA H200" and rec["errors"] == []
    assert rec["device"]["commit"].startswith("a1e9a4f")  # the measured tree, corrected when committed
    assert "d396ec4" in rec["device"]["commit_note"]  # what the run wrote, kept, not hidden
    assert rec["attention_backend"] == "reference"


@pytest.mark.parametrize("part,cells", [("stall", 6), ("capstone", 2)])
def test_the_shipped_serving_runs_carry_their_provenance(part, cells):
    data = load_serving(part, "h200")
    p = data["provenance"]
    assert data["what"] == part and len(data["rows"]) == cells
    assert (p["device"], p["commit"][:7], p["attention_backend"], p["runs_per_cell"]) == (
        "NVIDIA H200", "a1e9a4f", "reference", 1)
    assert p["torch"].startswith("2.") and p["cuda"] and p["how"]
    assert all(r["n"] == len(r.get("runs", [r])) == 1 for r in data["rows"])


def test_serving_parts_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown serving part 'warp'; allowed: stall, capstone"):
        load_serving("warp")
    data = load_serving("stall")
    data["rows"][0]["runs"] = []
    (tmp_path / "s.json").write_text(json.dumps(data))
    with pytest.raises(ValueError,
                       match=r"^not a valid stall file: rows\[0\].runs: List should have at least 1"):
        load_serving("stall", path=tmp_path / "s.json")
