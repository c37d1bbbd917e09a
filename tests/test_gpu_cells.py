"""Lesson GPU figures: the title names the source (a record with device and date, or a labelled
prediction); the source is chosen up front, a broken record raises instead of being hidden, and nothing is
ever measured, even where CUDA is present (measuring is ``make gpu-bench``)."""

import matplotlib
import pytest
import torch
from gpu_fixtures import small_record

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.gpu import sections, serving_sections, suite  # noqa: E402
from longctx.lessons import gpu_cells as cells  # noqa: E402

FIGURES = [cells.show_prefill_chunk_curve, cells.show_decode_bandwidth, cells.show_attention_share]


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.mark.parametrize("fn", FIGURES)
def test_without_a_record_the_prediction_is_labelled(fn, capsys):
    assert not cells.record_path("a100").is_file()
    ax = fn(gpu="a100")
    assert "prediction (no GPU record yet): A100 datasheet roofline" in ax.get_title()
    assert ax.lines and capsys.readouterr().err == ""


@pytest.mark.parametrize("fn", FIGURES)
def test_a_record_names_its_device_and_date(fn, capsys, tmp_path):
    _, ax = plt.subplots()
    assert fn(ax=ax, record=small_record()) is ax
    assert ("recorded: NVIDIA H200 (2026-01-01, commit not recorded, backend reference, n = 1)"
            in ax.get_title())
    assert len(ax.lines) >= 2 and capsys.readouterr().err == ""


@pytest.mark.parametrize("fn", FIGURES)
def test_a_broken_record_raises_with_the_reason(fn):
    bad = small_record()
    del bad["ceilings"]
    with pytest.raises(ValueError, match="ceilings: Field required"):
        fn(record=bad)


def test_with_cuda_present_the_cells_still_only_read_or_predict(monkeypatch):
    measured = []

    def measure(*args, **kwargs):
        measured.append(args)
        raise AssertionError("a lesson cell measured")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for module, name in [(suite, "run_suite"), (suite, "time_fn"), (suite, "Run"),
                         *((sections, s) for s in suite.SECTION_WEIGHTS), (serving_sections, "stall_run"),
                         (serving_sections, "capstone_run")]:
        monkeypatch.setattr(module, name, measure)
    assert cells.recorded_stall("h200") and cells.recorded_capstone("h200")  # read, never measured
    for fn in FIGURES:
        assert fn(gpu="a100").get_title().endswith("prediction (no GPU record yet): A100 datasheet roofline")
        assert "recorded: NVIDIA H200 (" in fn(record=small_record()).get_title()
    assert measured == []


def test_predictions_follow_the_roofline():
    pred = cells.predicted_prefill_curve("h200")
    assert pred[128] < pred[512] <= 989e12 * 1.0001  # small chunks are memory-bound: tensor cores idle
    bw = cells.predicted_decode_bandwidth("h200", batch_sizes=(1, 64), contexts=(1024,))
    assert bw[1024][1] == pytest.approx(4.8e12)


def test_the_shipped_h200_record_is_shown_with_its_commit():
    rec, label = cells.choose_source("h200")
    assert label == "recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)"
    assert rec["device"]["key"] == "h200"


def _two_backends(rec: dict) -> dict:
    fused = [{**r, "attention_backend": "fused", "time_s": r["time_s"] / 2,
              "flops_per_s": r["flops_per_s"] * 2}
             for r in rec["prefill_chunks"]]
    return {**rec,
            "prefill_chunks": [{**r, "attention_backend": "reference"}
                               for r in rec["prefill_chunks"]] + fused,
            "decode": rec["decode"] + [{**r, "attention_backend": "fused"} for r in rec["decode"]]}


def test_each_backend_is_its_own_curve():
    ax = cells.show_prefill_chunk_curve(record=_two_backends(small_record()))
    labels = [line.get_label() for line in ax.lines]
    assert "measured (reference backend)" in labels and "measured (fused backend)" in labels
    ax = cells.show_decode_bandwidth(record=_two_backends(small_record()))
    labels = [line.get_label() for line in ax.lines]
    # record's own: reference
    assert "context 1,024 (reference)" in labels and "context 1,024 (fused)" in labels


def test_recorded_stall_of_the_h200_run_with_its_provenance(capsys):
    cells_ = cells.recorded_stall("h200")
    assert len(cells_) == 6 and {c["source"] for c in cells_} == {
        "recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)"}
    by = {(c["long_prompt"], c["scheduler"]): c for c in cells_}
    # the record's finding (stall.log): chunked made the worst gap longer, 919 vs 554 ms at 8K / 512
    assert (round(by[8192, "chunked-512"]["worst_gap_s"] * 1e3) == 919
            and round(by[8192, "monolithic"]["worst_gap_s"] * 1e3) == 554)
    assert by[8192, "chunked-512"]["worst_gap_x_monolithic"] == pytest.approx(919 / 554, abs=0.01)
    assert by[32768, "chunked-2048"]["worst_gap_s"] == pytest.approx(2.93, abs=0.01)
    assert by[32768, "monolithic"]["ttft_x_monolithic"] == 1.0 and all(c["n"] == 1 for c in cells_)
    assert cells.recorded_stall("h200", backend="fused") == []  # not recorded yet: nothing invented
    text = cells.show_stall_table("h200")
    assert text.startswith("recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)")
    assert "chunked-512" in text and capsys.readouterr().out.strip() == text


def test_recorded_capstone_of_the_h200_run_says_what_it_did_not_record(capsys):
    rows = {r["kv_dtype"]: r for r in cells.recorded_capstone("h200")}
    assert set(rows) == {"bf16", "fp8"} and rows["fp8"]["gpu_mem_peak_gib"] < rows["bf16"]["gpu_mem_peak_gib"]
    assert rows["bf16"]["all_resident"] is None and rows["bf16"]["itl_median_s"] is None  # not recorded then
    assert (round(rows["bf16"]["gpu_mem_peak_gib"], 1) == 81.9
            and round(rows["fp8"]["ttft_median_s"], 1) == 32.1)
    text = cells.show_capstone_table("h200")
    assert "backend reference" in text and "n/r: not recorded" in text


def test_a_record_with_serving_sections_is_shown_beside_the_shipped_run(capsys):
    run = {"long_ttft_s": 0.5, "itl_median_s": 0.02, "itl_p99_s": 0.1, "itl_max_s": 0.2,
           "decoder_gaps_after_arrival": 100}
    stall = [{"long_prompt": 8192, "scheduler": "monolithic", "token_budget": None,
              "attention_backend": "fused",
              "n": 3, "runs": [run, {**run, "itl_max_s": 0.3}, {**run, "itl_max_s": 0.1}]}]
    cap = [{"users": 64, "prompt": 8192, "out_tokens": 80, "kv_dtype": "bf16", "attention_backend": "fused",
            "n": 1, "pool_blocks": 33600, "peak_resident": 64, "gpu_mem_peak_gib": 80.0, "ttft_median_s": 9.0,
            "ttft_max_s": 18.0, "itl_median_s": 0.05, "wall_s": 30.0}]
    rec = {**small_record(), "stall": stall, "capstone": cap}
    fused = cells.recorded_stall("h200", record=rec, backend="fused")
    assert (len(fused) == 1 and fused[0]["worst_gap_s"] == 0.2
            and (fused[0]["worst_gap_min_s"], fused[0]["worst_gap_max_s"]) == (0.1, 0.3))
    assert (fused[0]["source"]
            == "recorded: NVIDIA H200 (2026-01-01, commit not recorded, backend fused, n = 3)")
    assert len(cells.recorded_stall("h200", record=rec)) == 7  # the shipped reference run and this one
    assert [r["all_resident"] for r in cells.recorded_capstone("h200", record=rec, backend="fused")] == [True]
    assert "0.1-0.3" not in cells.show_stall_table("h200", record=rec)  # ms in the table
    assert "100-300" in capsys.readouterr().out


def test_nothing_recorded_says_so():
    assert cells.recorded_stall("a100") == [] and cells.recorded_capstone("a100") == []
    assert cells.show_stall_table("a100").startswith("no recorded stall run for A100 yet")


def test_recorded_label_names_device_date_commit_and_backends():
    assert (cells.recorded_label("h200")
            == "recorded: NVIDIA H200 (2026-12-04, commit a1e9a4f, backend reference, n = 1)")
    assert cells.recorded_label("a100") is None
    both = cells.recorded_label(record=_two_backends(small_record()))
    assert both == ("recorded: NVIDIA H200 (2026-01-01, commit not recorded, backend reference and fused, "
                    "n = 1)")
