"""``python -m longctx kv`` / ``flops``: JSON keys, hand values, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.cli.calc import token_count

ROOT = Path(__file__).resolve().parents[1]


def cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "longctx", *args], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=60,
    )


def test_kv_json_capstone():
    r = cli("kv", "--model", "llama-2-7b", "--tokens", "8192", "--dtype", "fp16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bytes_per_token"] == 524_288
    assert out["bytes"] == 4 * 2**30 and out["gib"] == 4.0


def test_kv_pool_with_prefix_json():
    r = cli("kv", "--model", "llama-3-8b", "--tokens", "8K", "--dtype", "fp8", "--requests", "64",
            "--shared-prefix", "2K", "--json")
    out = json.loads(r.stdout)
    assert out["bytes_per_token"] == 65_536 and out["gib"] == 24.125


def test_kv_table():
    r = cli("kv", "--model", "llama-3-8b", "--tokens", "1M", "--dtype", "int4")
    assert r.returncode == 0, r.stderr
    assert "32.000 GiB" in r.stdout and "KiB" in r.stdout


def test_flops_json_default_causal():
    r = cli("flops", "--model", "teaching-7b-mha", "--tokens", "4096", "--json")
    out = json.loads(r.stdout)
    assert {"linear_flops", "attention_flops", "attention_share"} <= out.keys()
    assert out["attention"] == "causal"
    assert out["linear_flops"] == 14e9 * 4096
    assert out["attention_flops"] == 2 * 32 * 4096 * 4096 * 4097


def test_flops_full_reproduces_seed():
    r = cli("flops", "--model", "teaching-7b-mha", "--tokens", "128K", "--attention", "full", "--json")
    out = json.loads(r.stdout)
    assert out["attention_flops"] / 1e12 == pytest.approx(9007.2, abs=0.1)
    assert out["attention_share"] == pytest.approx(0.831, abs=5e-4)


def test_flops_table():
    r = cli("flops", "--model", "llama-3-8b", "--tokens", "32K")
    assert r.returncode == 0, r.stderr
    assert "TFLOPs" in r.stdout and "%" in r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("kv", "--model", "gpt-9", "--tokens", "10"), ("kv", "--model", "llama-3-8b", "--tokens", "-5"),
        ("kv", "--model", "llama-3-8b", "--tokens", "10", "--dtype", "fp7"),
        ("kv", "--model", "llama-3-8b", "--tokens", "ten"), ("kv", "--model", "llama-3-8b"),
        ("flops", "--model", "llama-3-8b", "--tokens", "-1"), ("flops", "--model", "nope", "--tokens", "1"),
        ("flops", "--model", "llama-3-8b", "--tokens", "1", "--attention", "sparse"),
    ],
)
def test_bad_arguments_one_line(args):
    r = cli(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_token_count_suffixes():
    assert token_count("8K") == 8192 and token_count("1m") == 2**20 and token_count("1_000") == 1000
