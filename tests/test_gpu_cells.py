"""Lesson GPU cells: recorded file (device and date in the title), H100 estimate, or a labelled prediction;
never an exception, never a line on stderr."""

import copy

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.gpu import cells  # noqa: E402
from longctx.gpu.calibration import synthetic_record  # noqa: E402

CELLS = [cells.show_prefill_chunk_curve, cells.show_decode_bandwidth, cells.show_attention_share]
ALL = [*CELLS, cells.show_exercise1_itl]


@pytest.fixture(scope="module")
def record():
    r = synthetic_record()
    r["attention_share"] = [{"model": "llama-3-8b", "context_tokens": T, "attention_s": a, "rest_s": 1.0,
                             "attention_share": a / (a + 1.0), "flop_share": 0.1 * i + 0.05}
                            for i, (T, a) in enumerate([(1024, 0.02), (8192, 0.3), (65536, 2.0)])]
    return r


def _kw(fn, **kw):
    if fn is cells.show_exercise1_itl:
        kw.pop("live", None)
    return kw


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the cells measure live")
@pytest.mark.parametrize("fn", ALL)
def test_without_a_record_the_prediction_is_labelled(fn, capsys, monkeypatch):
    monkeypatch.setattr(cells, "_recorded", lambda gpu: (None, ""))
    ax = fn(**_kw(fn, live=None))
    assert "prediction (no GPU record yet)" in ax.get_title()
    assert ax.lines or ax.patches or ax.collections
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("fn", ALL)
def test_a_record_names_its_device_and_date(fn, record, capsys):
    _, ax = plt.subplots()
    assert fn(ax=ax, record=record, **_kw(fn, live=False)) is ax
    assert "recorded: NVIDIA H200, 2026-01-01" in ax.get_title()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("fn", ALL)
def test_h100_is_an_estimate_from_the_h200_record(fn, record):
    ax = fn(record=record, gpu="h100", **_kw(fn, live=False))
    assert "H100 estimated by roofline ratios from the NVIDIA H200 record of 2026-01-01" in ax.get_title()


@pytest.mark.parametrize("fn", ALL)
def test_a_broken_record_falls_back_without_raising(fn, record, capsys, monkeypatch):
    monkeypatch.setattr(cells, "_recorded", lambda gpu: (None, ""))
    bad = copy.deepcopy(record)
    del bad["ceilings"]
    ax = fn(record=bad, **_kw(fn, live=False))
    assert "prediction (no GPU record yet)" in ax.get_title()
    assert capsys.readouterr().err == ""


def test_drawing_errors_are_written_in_the_axes(capsys, monkeypatch):
    monkeypatch.setattr(cells, "_recorded", lambda gpu: (None, ""))

    def boom(*a, **k):
        raise RuntimeError("no numbers")

    monkeypatch.setattr(cells, "predicted_decode_bandwidth", boom)
    ax = cells.show_decode_bandwidth(live=False)
    assert "could not draw (RuntimeError: no numbers)" in ax.texts[0].get_text()
    assert capsys.readouterr().err == ""


def test_predictions_follow_the_roofline():
    pred = cells.predicted_prefill_curve("h200")
    assert pred[128] < pred[512] <= 989e12 * 1.0001  # small chunks are memory-bound: tensor cores idle
    bw = cells.predicted_decode_bandwidth("h200", batch_sizes=(1, 64), contexts=(1024,))
    assert bw[1024][1] == pytest.approx(4.8e12)
