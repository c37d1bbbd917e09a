"""GPU records: checked on load and save, one loader behaviour (ValueError naming what is wrong)."""

import json

import pytest
from gpu_fixtures import small_record

from longctx.gpu.records import check_record, describe, load_record, record_path, save_record


def test_save_and_load_round_trip(tmp_path):
    rec = small_record()
    path = save_record(rec, tmp_path / "h200.json")
    assert load_record(path=path) == json.loads(json.dumps(rec))
    assert describe(rec) == "NVIDIA H200, 2026-01-01"
    assert describe({**rec, "toy": True}).endswith(", toy run")


@pytest.mark.parametrize("change,match", [
    (lambda r: r.pop("ceilings"), "lacks ceilings"),
    (lambda r: r.update(schema="longctx.gpu/1"), "schema"),
    (lambda r: r.update(date="yesterday"), "isoformat|Invalid"),
    (lambda r: r["ceilings"]["copy"].update(bytes_per_s=0), "copy.bytes_per_s"),
    (lambda r: r["device"].pop("key"), "name and a key"),
])
def test_a_broken_record_says_what_is_wrong(change, match):
    rec = small_record()
    change(rec)
    with pytest.raises(ValueError, match=match):
        check_record(rec)


def test_absent_and_invalid_files_raise(tmp_path):
    with pytest.raises(ValueError, match="no recorded result 'no-such-gpu.json'"):
        load_record("no-such-gpu")
    assert not record_path("no-such-gpu").is_file()
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_record(path=tmp_path / "bad.json")
