"""The GPU suite end to end on the CPU at toy sizes, its timer, the gpu-bench command, and
scripts/gpu_run.sh --toy."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from longctx.__main__ import main
from longctx.cli.gpu import summary_lines
from longctx.gpu import sections
from longctx.gpu.records import check_record, load_record
from longctx.gpu.suite import SECTION_WEIGHTS, BenchConfig, run_suite, time_fn

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toy_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu") / "toy.json"
    # a cap wide enough for a loaded 2-core machine: this test checks the record, not the cap (tested below)
    assert main(["gpu-bench", "--toy", "--quiet", "--time-cap-s", "600", "--out", str(out)]) == 0
    return out, json.loads(out.read_text())


def test_toy_run_writes_a_valid_record_with_every_section(toy_record):
    path, rec = toy_record
    assert load_record(path=path) == rec
    assert rec["errors"] == []
    assert rec["toy"] is True and rec["device"]["key"] == "cpu" and rec["device"]["torch"] == torch.__version__
    assert rec["dtype"] == "fp32" and "commit" in rec["device"]  # provenance: the code that measured (git)
    assert set(rec["models"]) == {"llama-3-8b"}  # the name readers look up; TOY's shape in a toy run
    assert rec["models"]["llama-3-8b"]["config"]["name"] == "toy"
    for section in ("prefill_chunks", "decode", "attention_share"):
        assert rec[section] and {r["model"] for r in rec[section]} == {"llama-3-8b"}, section
    sizes = [r["chunk_size"] for r in rec["prefill_chunks"] if r["model"] == "llama-3-8b"]
    assert sizes == list(BenchConfig.toy().chunk_sizes)
    for r in rec["prefill_chunks"]:  # every token of the prompt prefilled once, each chunk after the previous
        assert sum(n for n, _, _ in r["chunks"]) == r["prompt_tokens"]
        assert [s for _, s, _ in r["chunks"]] == list(range(0, r["prompt_tokens"], r["chunk_size"]))
    assert any("KV over" in s for s in rec["skipped"])


def test_summary_mentions_each_part(toy_record):
    text = "\n".join(summary_lines(toy_record[1]))
    for word in ("ceilings", "prefill", "decode", "layer", "toy run"):
        assert word in text


def test_time_cap_skips_instead_of_overrunning():
    cfg = BenchConfig.toy(time_cap_s=1e-6, sections=("ceilings", "decode"))
    rec = run_suite(cfg, device="cpu")
    assert "decode" not in rec and any("time cap" in s for s in rec["skipped"])
    check_record(rec)


def test_a_failing_point_is_recorded_not_fatal(monkeypatch):
    def broken(run, name):
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(sections, "decode", broken)
    rec = run_suite(BenchConfig.toy(sections=("ceilings", "decode", "attention_share")), device="cpu")
    assert rec["errors"] == ["section decode: RuntimeError: CUDA error: an illegal memory access"]
    assert rec["attention_share"] and "ERRORS 1" in "\n".join(summary_lines(rec))
    check_record(rec)


def test_time_fn_median_of_repeats_after_warmup():
    calls = []
    t = time_fn(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and t.repeats == 5 and t.timer == "perf_counter"
    assert 0 <= t.min_s <= t.median_s <= t.max_s
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)


def test_bad_sections_and_cap_are_value_errors():
    with pytest.raises(ValueError, match="unknown sections"):
        BenchConfig.toy(sections=("warp",))
    with pytest.raises(ValueError, match="time_cap_s"):
        BenchConfig(time_cap_s=0)
    assert set(BenchConfig().sections) == set(SECTION_WEIGHTS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_gpu_bench_without_cuda_says_so_in_one_line(capsys):
    assert main(["gpu-bench"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1
    assert lines[0].startswith("no CUDA device:") and "use --toy to test the harness on the CPU" in lines[0]


@pytest.mark.parametrize("args", [["--time-cap-s", "-1"], ["--sections", "warp"]])
def test_gpu_bench_bad_arguments_exit_2_in_one_line(args, capsys):
    assert main(["gpu-bench", "--toy", *args]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_gpu_run_script_toy(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_BENCH_SECTIONS": "ceilings,prefill_chunks"}
    r = subprocess.run(["bash", "scripts/gpu_run.sh", "--toy"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert check_record(json.loads((tmp_path / "cpu-toy.json").read_text()))["toy"] is True
    assert "calibrated on prefill_chunks, decode" in r.stdout and "torch" in r.stderr
    assert (tmp_path / "gpu-bench-cpu-toy.log").is_file()
