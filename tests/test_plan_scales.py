"""The planner's scale layouts (``kv_scales``): per-tensor (vLLM's / SGLang's FP8 KV cache: scales are layer
parameters, 0 bytes per token), per-vector and per-group (in the pool, as this course's engine stores them),
and the default (the engine's). The source's capstone numbers, 24.125 GiB and 127 users, are exact under
per-tensor scales; checked through ``python -m longctx plan`` as a learner would run it."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from longctx import memory
from longctx.kv import quant
from longctx.kv.cache import PagedKVCache
from longctx.plan import KV_SCALES, plan, pool_blocks, scale_layout
from longctx.specs import get_model

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
CAPSTONE = dict(model="llama-3-8b", kv_dtype="fp8", users=64, context=8192, shared_prefix=2048, pool_gib=48)
CLI = [
    "--model", "llama-3-8b", "--kv-dtype", "fp8", "--users", "64", "--context", "8192", "--shared-prefix",
    "2048", "--pool-gib", "48", "--kv-scales", "per-tensor",
]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "longctx", "plan", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_cli_per_tensor_reproduces_the_source():
    out = _cli(*CLI, "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    d = json.loads(out.stdout)
    assert d["kv_scales"] == "per-tensor"
    assert d["bytes_per_token"] == 2 * 32 * 8 * 128 == 65_536 and d["scale_bytes_per_token"] == 0
    assert d["gib"] == 24.125 and d["bytes"] == d["naive_bytes"]  # block rounding costs nothing here
    assert d["max_users"] == 127
    assert d["pool_blocks"] == 48 * 1024 and d["blocks"] == 128 + 64 * 384


def test_cli_table_names_the_layout():
    out = _cli(*CLI)
    assert out.returncode == 0, out.stderr
    assert "per-tensor" in out.stdout and "24.125 GiB" in out.stdout and "127" in out.stdout


def test_cli_default_is_the_engines_layout():
    default = json.loads(_cli(*CLI[:-2], "--json").stdout)
    assert default["kv_scales"] == "per-vector" and default["bytes_per_token"] == 66_560
    assert default["max_users"] == 125 and abs(default["gib"] - 24.502) < 1e-3


def test_cli_refuses_a_layout_for_a_plain_format():
    out = _cli(
        "--model", "llama-3-8b", "--kv-dtype", "bf16", "--users", "1", "--context", "16", "--pool-gib", "1",
        "--kv-scales", "per-group",
    )
    assert out.returncode == 2 and "no scales" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_difference_is_all_scales():
    """Our per-vector scales are the whole 0.377 GiB between the engine's plan and vLLM's layout."""
    ours, theirs = plan(**CAPSTONE), plan(**CAPSTONE, kv_scales="per-tensor")
    assert ours.blocks == theirs.blocks == 24_704
    assert ours.bytes - theirs.bytes == 24_704 * 16 * ours.scale_bytes_per_token
    assert round((ours.bytes - theirs.bytes) / GiB, 3) == 0.377


@pytest.mark.parametrize("model", ["llama-3-8b", "llama-2-7b", "smollm2-135m", "mistral-7b"])
@pytest.mark.parametrize("kv", list(quant.FORMATS))
def test_default_layout_is_what_the_engine_allocates(model, kv):
    assert plan(model, kv, 1, 16, pool_gib=1).bytes_per_token == quant.pool_bytes_per_token(model, kv)
    if model == "smollm2-135m":  # the real pool
        assert PagedKVCache.for_model(
            get_model(model), 4, 16, kv_dtype=kv
        ).nbytes == 4 * 16 * quant.pool_bytes_per_token(model, kv)


@pytest.mark.parametrize(
    "kv,layout,scales",
    [
        ("fp8", "per-tensor", 0), ("fp8", "per-vector", 1), ("fp8", "per-group", 4),
        ("int8", "per-tensor", 0), ("int8", "per-vector", 1), ("int8", "per-group", 4),
        ("int4", "per-tensor", 0), ("int4", "per-group", 4),
    ],
)
def test_layouts_by_hand(kv, layout, scales):
    code = {"fp8": 128, "int8": 128, "int4": 64}[kv]
    assert quant.pool_bytes_per_token("llama-3-8b", kv, layout) == 2 * 32 * 8 * (code + 2 * scales)
    p = plan("llama-3-8b", kv, 3, 100, pool_gib=1, kv_scales=layout)
    assert p.kv_scales == layout and p.scale_bytes_per_token == 2 * 32 * 8 * 2 * scales
    assert pool_blocks("llama-3-8b", kv, 16, pool_gib=1, kv_scales=layout) == p.pool_blocks


def test_plain_formats():
    for kv in ("fp32", "fp16", "bf16"):
        assert scale_layout(kv) is None and scale_layout(kv, "per-tensor") is None
        assert plan("llama-3-8b", kv, 2, 64, pool_gib=1, kv_scales="per-tensor") == plan(
            "llama-3-8b", kv, 2, 64, pool_gib=1
        )
        for bad in ("per-vector", "per-group"):
            with pytest.raises(ValueError, match="no scales"):
                plan("llama-3-8b", kv, 2, 64, pool_gib=1, kv_scales=bad)
    assert plan("llama-3-8b", "bf16", 1, 16, pool_gib=1).kv_scales is None


def test_bad_layout_and_group_that_does_not_divide():
    with pytest.raises(ValueError, match="allowed: " + ", ".join(KV_SCALES)):
        plan(**CAPSTONE, kv_scales="per-channel")
    odd = dataclasses.replace(get_model("llama-3-8b"), name="odd", head_dim=48)
    with pytest.raises(ValueError, match="does not divide"):
        quant.pool_bytes_per_token(odd, "fp8", "per-group")
    assert quant.pool_bytes_per_token(odd, "fp8", "per-vector") == 2 * 32 * 8 * (48 + 2)


def test_per_tensor_textbook_equality_when_everything_is_a_multiple_of_the_block():
    """Under per-tensor scales plan bytes == textbook bytes iff block rounding costs nothing."""
    for prefix, context, block, equal in (
        (2048, 8192, 16, True), (2050, 8192, 16, False), (2048, 8200, 16, False), (2048, 8192, 256, True),
        (0, 100, 16, False),
    ):
        p = plan("llama-3-8b", "fp8", 64, context, prefix, block, pool_gib=48, kv_scales="per-tensor")
        assert (p.bytes == p.naive_bytes) is equal, (prefix, context, block)
        assert p.bytes >= p.naive_bytes
    assert memory.kv_bytes_per_token("llama-3-8b", "fp8") == quant.pool_bytes_per_token(
        "llama-3-8b", "fp8", "per-tensor"
    )
