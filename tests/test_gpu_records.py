"""The recorded-file schema, its loader, and H100 estimates from an H200 record by roofline ratios."""

import copy
import json

import pytest

from longctx.gpu.calibration import synthetic_record
from longctx.gpu.records import SCHEMA, describe, estimate_for, load_recorded, save_record, validate_record

RATIO_BW = 4.8 / 3.35  # H200 / H100 SXM bandwidth; bf16 peaks are equal (989 TFLOP/s)


@pytest.fixture(scope="module")
def record():
    return validate_record(synthetic_record())


def _broken(record, path, value):
    r = copy.deepcopy(record)
    *head, last = path
    d = r
    for k in head:
        d = d[k]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value
    return r


@pytest.mark.parametrize("path,value,message", [
    (("schema",), "other/9", "record.schema must be"),
    (("date",), "yesterday", "ISO 8601"),
    (("toy",), "no", "record.toy"),
    (("device", "driver"), KeyError, "record.device lacks driver"),
    (("device", "name"), "", "record.device.name"),
    (("ceilings", "copy"), KeyError, "record.ceilings lacks copy"),
    (("ceilings", "matmul", "flops_per_s"), -1.0, "record.ceilings.matmul.flops_per_s must be a positive"),
    (("decode", 0, "step_s"), 0.0, r"record.decode\[0\].step_s must be a positive"),
    (("decode", 1, "model"), "llama-9b", "not described under record.models"),
    (("prefill_chunks", 0, "chunks", 2), [1, 2], r"chunks\[2\] must be"),
    (("prefill_chunks", 1, "flops_per_s"), float("nan"), "positive finite"),
    (("decode",), {}, "record.decode must be a list"),
    (("exercise1", "runs", "chunked-512", "itl_s"), [], "itl_s is empty"),
])
def test_validate_record_says_what_is_wrong(record, path, value, message):
    with pytest.raises(ValueError, match=message):
        validate_record(_broken(record, path, value))


def test_save_and_load_round_trip(record, tmp_path):
    p = save_record(record, tmp_path / "sub" / "h200.json")
    assert load_recorded(path=p) == json.loads(json.dumps(record))
    assert load_recorded(path=tmp_path / "absent.json") is None
    assert load_recorded("no-such-gpu") is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_recorded(path=tmp_path / "bad.json")
    with pytest.raises(ValueError, match="schema"):
        save_record({**record, "schema": "x"}, tmp_path / "x.json")
    assert SCHEMA == record["schema"]


def test_estimate_h100_from_h200(record):
    est = validate_record(estimate_for(record, "h100"))
    assert est["estimated"] is True and est["device"]["key"] == "h100"
    assert est["estimated_from"]["device"] == "NVIDIA H200"
    assert "estimated by roofline ratios from the NVIDIA H200 record of 2026-01-01" in describe(est)
    c0, c1 = record["ceilings"], est["ceilings"]
    assert c1["matmul"]["flops_per_s"] == pytest.approx(c0["matmul"]["flops_per_s"])  # same compute
    assert c0["copy"]["bytes_per_s"] / c1["copy"]["bytes_per_s"] == pytest.approx(RATIO_BW)
    # decode is memory-bound: every step is 4.8 / 3.35 slower
    for a, b in zip(record["decode"], est["decode"], strict=True):
        assert b["step_s"] / a["step_s"] == pytest.approx(RATIO_BW)
    # a 4096-token chunk is compute-bound: unchanged; a 128-token chunk after a short prefix is memory-bound
    big = next(r for r in est["prefill_chunks"] if r["chunk_size"] == 4096)
    big0 = next(r for r in record["prefill_chunks"] if r["chunk_size"] == 4096)
    assert big["time_s"] == pytest.approx(big0["time_s"])
    small = next(r for r in est["prefill_chunks"] if r["chunk_size"] == 128)
    small0 = next(r for r in record["prefill_chunks"] if r["chunk_size"] == 128)
    assert small["chunks"][0][2] / small0["chunks"][0][2] == pytest.approx(RATIO_BW)
    assert record["decode"][0]["step_s"] < est["decode"][0]["step_s"]  # the input is not modified


def test_estimate_shifts_exercise1_tokens_by_the_rescaled_steps(record):
    est = estimate_for(record, "h100")
    run0, run1 = record["exercise1"]["runs"]["chunked-512"], est["exercise1"]["runs"]["chunked-512"]
    ratios = [b["duration_s"] / a["duration_s"] for a, b in zip(run0["steps"], run1["steps"], strict=True)]
    assert all(r == pytest.approx(1.0) or r == pytest.approx(RATIO_BW) for r in ratios)
    assert any(r == pytest.approx(RATIO_BW) for r in ratios)
    # the synthetic streams get a token at the end of every step: each gap is that step's new duration
    assert run1["itl_s"][:len(ratios)] == pytest.approx([st["duration_s"] for st in run1["steps"]])
    assert run1["ttft_s"][0] == pytest.approx(sum(st["duration_s"] for st in run1["steps"][:4]))


def test_estimate_drops_decode_points_that_do_not_fit(record):
    r = copy.deepcopy(record)
    r["decode"].append({**r["decode"][0], "batch_size": 256, "context_tokens": 4096, "bytes": 150e9})
    est = estimate_for(r, "h100")
    assert len(est["decode"]) == len(record["decode"])
    assert any("do not fit h100" in s for s in est["skipped"])


def test_estimate_needs_a_known_source_gpu(record):
    r = copy.deepcopy(record)
    r["device"]["key"] = "cpu"
    with pytest.raises(ValueError, match="unknown hardware"):
        estimate_for(r, "h100")
    assert estimate_for(r, "h100", source_hw="h200")["estimated"]
