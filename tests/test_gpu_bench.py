"""The GPU suite end to end on the CPU at toy sizes, its timer, the gpu-bench command, and
scripts/gpu_run.sh --toy."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from longctx.__main__ import main
from longctx.cli.gpu import summary_lines
from longctx.gpu import sections, serving_sections
from longctx.gpu.record_schema import GpuRecord
from longctx.gpu.records import check_record, load_record, row_backend, stall_cell
from longctx.gpu.suite import SECTION_WEIGHTS, BenchConfig, Run, run_suite, time_fn

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
    assert (rec["toy"] is True and rec["device"]["key"] == "cpu"
            and rec["device"]["torch"] == torch.__version__)
    assert rec["dtype"] == "fp32" and "commit" in rec["device"]  # provenance: the code that measured (git)
    assert set(rec["models"]) == {"llama-3-8b"}  # the name readers look up; TOY's shape in a toy run
    assert rec["models"]["llama-3-8b"]["config"]["name"] == "toy"
    for section in ("prefill_chunks", "decode", "attention_share"):
        assert rec[section] and {r["model"] for r in rec[section]} == {"llama-3-8b"}, section
    for backend in ("reference", "fused"):  # side by side: every point with each backend, each row naming it
        sizes = [r["chunk_size"] for r in rec["prefill_chunks"] if r["attention_backend"] == backend]
        assert sizes == list(BenchConfig.toy().chunk_sizes), backend
    by_variant = {}
    for r in rec["decode"]:
        by_variant.setdefault(row_backend(rec, r), []).append((r["batch_size"], r["context_tokens"]))
    # the fused backend once more through its decode graphs' buffers (eager on a CPU: no capture)
    assert set(by_variant) == {"reference", "fused", "fused+buffers"}
    assert by_variant["reference"] == by_variant["fused"] == by_variant["fused+buffers"] != []
    assert {r.get("cuda_graphs") for r in rec["decode"]} == {None, "eager-buffers"}
    for r in rec["prefill_chunks"]:  # every token of the prompt prefilled once, each chunk after the previous
        assert sum(n for n, _, _ in r["chunks"]) == r["prompt_tokens"]
        assert [s for _, s, _ in r["chunks"]] == list(range(0, r["prompt_tokens"], r["chunk_size"]))
    assert any("KV over" in s for s in rec["skipped"])


def test_summary_mentions_each_part(toy_record):
    text = "\n".join(summary_lines(toy_record[1]))
    for word in ("ceilings", "prefill", "decode reference", "decode fused", "decode fused+buffers", "layer",
                 "toy run", "stall", "capstone", "commit", "decode profile", "GPU time absent (no GPU)",
                 "flex decode kernel", "engine prefill 256 in chunks of 32"):
        assert word in text


def test_toy_decode_profile_has_host_and_wall_time_and_no_gpu_time(toy_record):
    rec, cfg = toy_record[1], BenchConfig.toy()
    rows = rec["decode_profile"]
    assert {(r["batch_size"], r["context_tokens"]) for r in rows} == set(cfg.decode_profile_points)
    assert {(r["attention_backend"], r["cuda_graphs"]) for r in rows} == {
        ("reference", "off"), ("fused", "off"), ("fused", "eager-buffers")}
    for r in rows:  # a CPU: the call's own time is the step's (no GPU to wait for), GPU time marked absent
        assert r["gpu_s"] is None and r["bound"] is None and r["gpu_time"] == "absent (no GPU)"
        assert 0 < r["host_s"] <= r["wall_s"] and r["repeats"] == cfg.repeats
    (flex,) = rec["flex_decode"]
    b, L = cfg.decode_profile_points[0]
    assert flex["kv_bytes"] == b * (L + 1) * 2 * 16 * 2 * 4 and flex["timer"] == "perf_counter"


def test_toy_engine_prefill_is_chunked_over_a_scattered_pool_beside_the_whole_prompt(toy_record):
    rec, cfg = toy_record[1], BenchConfig.toy()
    rows = {r["chunk_size"]: r for r in rec["prefill_engine"]}
    T = cfg.prefill_prompt_tokens
    assert set(rows) == {T, *cfg.engine_prefill_chunks} and all(r["scattered"] for r in rows.values())
    assert rows[T]["steps"] == 1 and rows[32]["steps"] == T // 32  # one output token: no decode step
    assert rows[32]["share_of_whole_rate"] == pytest.approx(rows[T]["time_s"] / rows[32]["time_s"])
    assert all(r["n"] == cfg.repeats and r["min_s"] <= r["time_s"] <= r["max_s"] for r in rows.values())


def test_the_preflight_is_in_the_record(toy_record):
    pre = toy_record[1]["preflight"]
    assert pre["kernel_failures"] == [] and pre["cuda_graphs"] == "off: not on CUDA"
    assert pre["free_bytes"] is None and toy_record[1]["fallbacks"] == []


def test_the_schema_names_the_new_sections():
    assert {"stall", "capstone", "prefill_chunks", "decode", "decode_profile", "flex_decode",
            "prefill_engine", "preflight", "fallbacks"} <= set(GpuRecord.model_fields)
    assert set(SECTION_WEIGHTS) == {"ceilings", "prefill_chunks", "decode", "decode_profile",
                                    "attention_share", "prefill_engine", "stall", "capstone"}


def test_toy_stall_has_every_cell_with_its_runs(toy_record):
    rec, cfg = toy_record[1], BenchConfig.toy()
    cells = {(r["long_prompt"], r["token_budget"]) for r in rec["stall"]}
    assert cells == {(L, b) for L in cfg.stall_long_prompts for b in (None, *cfg.stall_budgets)}
    for r in rec["stall"]:
        # >= 5 runs per cell after a warm-up: n and spread
        assert r["n"] == len(r["runs"]) == cfg.stall_repeats >= 5
        assert r["attention_backend"] == "reference" and r["decoders"] == cfg.stall_decoders  # auto on a CPU
        assert r["scheduler"] == ("monolithic" if r["token_budget"] is None else "chunked")
        for run in r["runs"]:
            assert 0 < run["itl_median_s"] <= run["itl_p99_s"] <= run["itl_max_s"] and run["long_ttft_s"] > 0
            assert run["decoder_gaps_after_arrival"] >= cfg.stall_decoders * cfg.stall_tail_steps
        s = stall_cell(r)
        assert s["worst_gap_s"]["min"] <= s["worst_gap_s"]["median"] <= s["worst_gap_s"]["max"]
    chunked = [r for r in rec["stall"] if r["token_budget"] is not None]
    # a chunked run takes at least ceil(prompt / (budget - decoders)) steps to the long prompt's first token
    assert all(run["steps"] >= -(-r["long_prompt"] // (r["token_budget"] - cfg.stall_decoders))
               for r in chunked for run in r["runs"])


def test_toy_capstone_holds_every_user_at_once_per_kv_dtype(toy_record):
    rec, cfg = toy_record[1], BenchConfig.toy()
    rows = {r["kv_dtype"]: r for r in rec["capstone"]}
    assert set(rows) == set(cfg.capstone_kv_dtypes)
    for r in rows.values():
        assert r["peak_resident"] == r["users"] == cfg.capstone_users and r["full_batch_decode_steps"] >= 1
        assert r["preemptions"] == 0 and r["gpu_mem_peak_gib"] is None  # no GPU: not measured
        assert r["n"] == len(r["runs"]) == cfg.capstone_repeats  # in rounds over the KV dtypes
        assert all(run["peak_resident"] == cfg.capstone_users for run in r["runs"])
        assert r["cuda_graphs"]["decision"] == "off: not on CUDA"
        assert (0 < r["ttft_median_s"] <= r["ttft_p90_s"] <= r["ttft_max_s"]
                and r["itl_median_s"] <= r["itl_max_s"])
    assert (rows["fp8"]["pool_bytes"] < rows["fp32"]["pool_bytes"]
            and rows["fp8"]["pool_blocks"] == rows["fp32"]["pool_blocks"])


def test_an_engine_run_past_the_deadline_is_stopped_and_skipped():
    rec = {"errors": [], "skipped": [], "models": {}}
    run = Run(rec, BenchConfig.toy(), torch.device("cpu"), torch.float32, lambda _msg: None)
    run.deadline = 0.0  # long past
    assert run.point("stall run", lambda: serving_sections.stall_run(run, "llama-3-8b", 128, 32),
                     timed=False) is None
    assert rec["errors"] == [] and rec["skipped"] == ["stall run (time cap: stopped after 0 steps)"]


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
    with pytest.raises(ValueError,
                       match="unknown attention backend 'flash'; allowed: auto, reference, fused"):
        BenchConfig.toy(attention_backends=("reference", "flash"))
    with pytest.raises(ValueError, match="stall_repeats"):
        BenchConfig.toy(stall_repeats=0)
    assert set(BenchConfig().sections) == set(SECTION_WEIGHTS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_gpu_bench_without_cuda_says_so_in_one_line(capsys):
    assert main(["gpu-bench"]) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1
    assert lines[0].startswith("no CUDA device:") and "use --toy to test the harness on the CPU" in lines[0]


@pytest.mark.parametrize("args", [["--time-cap-s", "-1"], ["--sections", "warp"],
                                  ["--attention-backends", "x"], ["--attention-backend", "flash"],
                                  ["--cuda-graphs", "on"], ["--quick"]])
def test_gpu_bench_bad_arguments_exit_2_in_one_line(args, capsys):
    assert main(["gpu-bench", "--toy", *args]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_gpu_bench_toy_with_the_fused_backend_records_what_ran(tmp_path, capsys):
    out = tmp_path / "toy.json"
    args = ["--toy", "--quiet", "--attention-backend", "fused", "--sections", "decode,stall", "--out", out]
    assert main(["gpu-bench", *map(str, args)]) == 0
    rec = json.loads(out.read_text())
    assert rec["errors"] == [] and {r["attention_backend"] for r in rec["stall"]} == {"fused"}
    assert {r["attention_backend"] for r in rec["decode"]} == {"reference", "fused"}  # side by side
    assert str(out) in capsys.readouterr().out


def test_gpu_run_script_toy(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "GPU_BENCH_SECTIONS": "ceilings,prefill_chunks"}
    r = subprocess.run(["bash", "scripts/gpu_run.sh", "--toy"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert check_record(json.loads((tmp_path / "cpu-toy.json").read_text()))["toy"] is True
    assert "calibrated on prefill_chunks, decode" in r.stdout and "torch" in r.stderr
    assert (tmp_path / "gpu-bench-cpu-toy.log").is_file()


def test_each_section_is_checkpointed_so_a_killed_run_keeps_what_it_measured():
    saved = []
    rec = run_suite(BenchConfig.toy(sections=("ceilings", "attention_share")), device="cpu",
                    checkpoint=lambda partial: saved.append(check_record(partial)))
    assert [("attention_share" in p, p["complete"]) for p in saved] == [(False, False)]  # after ceilings
    assert rec["complete"] is True and rec["attention_share"]


def test_capstone_with_the_fused_backend_names_what_ran_per_pool():
    rec = run_suite(BenchConfig.toy(sections=("capstone",), serving_backend="fused"), device="cpu")
    assert rec["errors"] == []
    ran = [(r["kv_dtype"], r["attention_backend"]) for r in rec["capstone"]]
    # fused cannot read a quantized pool (the row says so), so the model's dtype also runs on reference, last:
    # the pair that differs in the KV dtype alone
    assert ran == [("fp32", "fused"), ("fp8", "reference"), ("fp32", "reference")]


def test_the_real_run_is_capped_within_8_minutes():
    text = (ROOT / "scripts" / "gpu_run.sh").read_text()
    cap = int(re.search(r'CAP="\$\{GPU_BENCH_TIME_CAP_S:-(\d+)\}"', text)[1])
    grace = int(re.search(r'timeout "\$\(\( \$\{CAP%\.\*\} \+ (\d+) \)\)"', text)[1])
    assert cap == BenchConfig().time_cap_s and cap + grace <= 8 * 60  # killed by then, whatever happens


# The lent GPU machines have torch, numpy and matplotlib but no pydantic (nor FastAPI): a finder that refuses
# them, installed before anything is imported, stands in for such a machine.
_NO_PYDANTIC = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pydantic", "pydantic_core", "fastapi"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _Refuse())
"""


def test_gpu_bench_runs_where_pydantic_is_missing(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_NO_PYDANTIC)
    out = tmp_path / "rec.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    cmd = [sys.executable, "-m", "longctx", "gpu-bench", "--toy", "--quiet", "--sections", "ceilings,decode",
           "--time-cap-s", "300", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "pydantic" not in done.stderr
    check_record(json.loads(out.read_text()))  # here, with pydantic: the whole schema


def test_cuda_graphs_off_leaves_only_the_eager_rows(tmp_path):
    out = tmp_path / "toy.json"
    assert main(["gpu-bench", "--toy", "--quiet", "--cuda-graphs", "off", "--sections", "decode",
                 "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert {row_backend(rec, r) for r in rec["decode"]} == {"reference", "fused"}
    assert rec["config"]["cuda_graphs"] == "off" and rec["preflight"]["cuda_graphs"] == "off: asked for"


def test_quick_is_every_section_at_a_small_cards_sizes():
    q = BenchConfig.quick()
    assert q.is_quick and q.sections == BenchConfig().sections and q.time_cap_s <= 300
    assert q.stall_repeats >= 5 and q.prefill_prompt_tokens <= BenchConfig().prefill_prompt_tokens
    assert BenchConfig.quick(time_cap_s=100).time_cap_s == 100


def test_a_learners_record_draws_in_the_lessons_gpu_cells(toy_record):
    import matplotlib

    matplotlib.use("Agg")
    from longctx.lessons.gpu_cells import record_line, show_decode_bandwidth, show_prefill_chunk_curve

    path, rec = toy_record
    ax = show_decode_bandwidth(record=path)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("fused+buffers" in t for t in labels) and "toy run" in ax.get_title()
    show_prefill_chunk_curve(record=path)
    assert record_line(rec).startswith("recorded: cpu, toy run")
