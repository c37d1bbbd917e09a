"""Lesson GPU figures: the title names the source (a record with device and date, or a labelled
prediction); the source is chosen up front, a broken record raises instead of being hidden, and nothing is
ever measured, even where CUDA is present (measuring is ``make gpu-bench``)."""

import matplotlib
import pytest
import torch
from gpu_fixtures import small_record

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from longctx.gpu import sections, suite  # noqa: E402
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
    assert "recorded: NVIDIA H200, 2026-01-01" in ax.get_title()
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
                         *((sections, s) for s in suite.SECTION_WEIGHTS)]:
        monkeypatch.setattr(module, name, measure)
    for fn in FIGURES:
        assert fn(gpu="a100").get_title().endswith("prediction (no GPU record yet): A100 datasheet roofline")
        assert "recorded: NVIDIA H200" in fn(record=small_record()).get_title()
    assert measured == []


def test_predictions_follow_the_roofline():
    pred = cells.predicted_prefill_curve("h200")
    assert pred[128] < pred[512] <= 989e12 * 1.0001  # small chunks are memory-bound: tensor cores idle
    bw = cells.predicted_decode_bandwidth("h200", batch_sizes=(1, 64), contexts=(1024,))
    assert bw[1024][1] == pytest.approx(4.8e12)
