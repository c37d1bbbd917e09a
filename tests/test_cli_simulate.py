"""``python -m longctx simulate``: JSON contract, determinism, one-line errors with exit status 2."""

import json
import subprocess
import sys

import pytest

BASE = ["--model", "llama-3-8b", "--gpu", "h100", "--num-requests", "40", "--rate", "8",
        "--prompt-tokens", "1K", "--output-tokens", "16"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "longctx", "simulate", *args], capture_output=True,
                          text=True, timeout=60)


def test_json_contract_and_same_seed_same_output():
    a = _cli(*BASE, "--scheduler", "chunked", "--token-budget", "256", "--seed", "3", "--json")
    b = _cli(*BASE, "--scheduler", "chunked", "--token-budget", "256", "--seed", "3", "--json")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout
    out = json.loads(a.stdout)
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert {"p50", "p90", "p95", "p99"} <= set(out[key])
        assert all(isinstance(out[key][p], float) for p in ("p50", "p90", "p95", "p99"))
    assert out["throughput_tok_s"] > 0 and out["completed"] == 40
    assert out["config"]["token_budget"] == 256 and out["config"]["seed"] == 3


def test_table_output_and_plot(tmp_path):
    plot = tmp_path / "sim.png"
    r = _cli(*BASE, "--scheduler", "monolithic", "--plot", str(plot))
    assert r.returncode == 0, r.stderr
    assert "TTFT" in r.stdout and "ITL" in r.stdout and "throughput" in r.stdout
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize("args", [
    ["--scheduler", "fifo"],                                   # bad choice (argparse)
    ["--scheduler", "chunked", "--token-budget", "0"],         # ValueError from the command
    ["--scheduler", "chunked", "--rate", "-1"],
    ["--scheduler", "chunked", "--rate", "fast"],
    ["--scheduler", "chunked", "--model", "gpt-5"],
    ["--scheduler", "chunked", "--prompt-tokens", "100K"],     # over the model's 8K context
    ["--scheduler", "chunked", "--kv-dtype", "fp9"],
    ["--scheduler", "chunked", "--pool-gib", "0"],
    ["--scheduler", "chunked", "--pool-gib", "lots"],
    ["--scheduler", "chunked", "--shared-prefix", "2K"],       # longer than the 1K prompts
    ["--scheduler", "chunked", "--shared-prefix", "-1"],
])
def test_bad_arguments_exit_2_with_one_line(args):
    full = list(BASE)
    for i in range(0, len(args), 2):  # later flags override BASE's
        if args[i] in full:
            full[full.index(args[i]) + 1] = args[i + 1]
        else:
            full += args[i:i + 2]
    r = _cli(*full)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_kv_dtype_pool_gib_and_prefix_caching_options():
    base = [*BASE, "--scheduler", "chunked", "--rate", "inf", "--pool-gib", "48", "--shared-prefix", "512",
            "--json"]
    plain = _cli(*base, "--kv-dtype", "FP8")
    cached = _cli(*base, "--kv-dtype", "fp8", "--prefix-caching")
    assert plain.returncode == 0 and cached.returncode == 0, plain.stderr + cached.stderr
    p, c = json.loads(plain.stdout), json.loads(cached.stdout)
    from longctx.plan import plan

    assert p["config"]["num_blocks"] == plan("llama-3-8b", "fp8", 40, 1040, pool_gib=48).pool_blocks == 48_395
    assert p["config"]["kv_dtype"] == "fp8" and p["config"]["pool_bytes_per_token"] == 66_560
    assert not p["config"]["prefix_caching"] and c["config"]["prefix_caching"]
    assert c["config"]["shared_prefix_tokens"] == 512
    assert p["prefix_hit_tokens"] == 0 and c["prefix_hit_tokens"] == 39 * 512
    assert c["prefill_tokens"] == p["prefill_tokens"] - 39 * 512
    table = _cli(*base[:-1], "--prefix-caching")
    assert table.returncode == 0 and "19,968 hit tokens" in table.stdout, table.stdout + table.stderr
