"""KV-pool planner: capstone numbers by hand, block rounding, agreement with the block manager, properties,
clear errors, and ``python -m longctx plan``."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx import memory
from longctx.__main__ import main
from longctx.kv import quant
from longctx.kv.block_manager import BlockManager
from longctx.plan import Plan, plan
from longctx.specs import get_model

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30

CAPSTONE = dict(model="llama-3-8b", kv_dtype="fp8", users=64, context=8192, shared_prefix=2048, pool_gib=48)


def test_capstone_by_hand():
    p = plan(**CAPSTONE)
    # 2 (K, V) x 32 layers x 8 KV heads x (128 fp8 codes + one 2-byte fp16 scale per vector)
    assert p.bytes_per_token == 2 * 32 * 8 * (128 + 2) == 66_560
    assert p.scale_bytes_per_token == 2 * 32 * 8 * 2 == 1_024
    assert p.block_bytes == 16 * 66_560 == 1_064_960
    assert p.pool_bytes == 48 * GiB
    assert p.pool_blocks == 48 * GiB // 1_064_960 == 48_395
    assert p.shared_blocks == 2048 // 16 == 128
    assert p.per_user_blocks == (8192 - 2048) // 16 == 384
    assert p.blocks == 128 + 64 * 384 == 24_704
    assert p.bytes == 24_704 * 1_064_960 == 26_308_771_840
    assert p.fits is True
    assert p.headroom_bytes == 48_395 * 1_064_960 - 26_308_771_840 > 0
    # max users = floor((48,395 - 128) / 384) = floor(125.7) = 125
    assert p.max_users == 125
    assert (p.model, p.kv_dtype, p.users, p.context, p.shared_prefix, p.block_size) == (
        "llama-3-8b", "fp8", 64, 8192, 2048, 16)


def test_capstone_textbook_number():
    p = plan(**CAPSTONE)
    expected = memory.kv_pool_bytes("llama-3-8b", 64, 8192, "fp8", 2048, block_size=None)
    assert p.naive_bytes == expected
    assert p.naive_bytes / GiB == 24.125  # the source's "~24.1 GiB"
    assert p.naive_bytes == (64 * 8192 - 63 * 2048) * memory.kv_bytes_per_token("llama-3-8b", "fp8")


def test_pool_bytes_equals_pool_gib():
    assert plan(**{**CAPSTONE, "pool_gib": None}, pool_bytes=48 * GiB) == plan(**CAPSTONE)


def test_llama2_fp16_no_prefix_does_not_fit():
    p = plan("llama-2-7b", "fp16", 64, 8192, pool_gib=48)
    # 2 x 32 x 32 x 128 x 2 B = 524,288 B/token, no scales; block = 8 MiB; pool = 48 GiB / 8 MiB = 6,144
    # blocks
    assert p.bytes_per_token == 524_288 and p.scale_bytes_per_token == 0
    assert p.pool_blocks == 6_144
    assert p.per_user_blocks == 8192 // 16 == 512
    assert p.blocks == 64 * 512 == 32_768
    assert p.fits is False
    assert p.headroom_bytes == (6_144 - 32_768) * 8 * 2**20 < 0  # the shortfall: -208 GiB
    assert p.max_users == 6_144 // 512 == 12


def test_context_rounds_up_per_user():
    p = plan("smollm2-135m", "fp16", 3, 100, block_size=16, pool_gib=1)
    assert p.per_user_blocks == 7  # ceil(100 / 16): 12 empty slots per user
    assert p.blocks == 21 and p.bytes == 21 * 16 * p.bytes_per_token


def test_partial_prefix_block_is_not_shared():
    p = plan("smollm2-135m", "int8", 3, 100, shared_prefix=40, block_size=16, pool_gib=1)
    assert p.shared_blocks == 2  # floor(40 / 16): tokens 32..39 live in each user's own block
    assert p.per_user_blocks == 5  # ceil((100 - 32) / 16)
    assert p.blocks == 2 + 3 * 5
    # same token slots as memory's paged arithmetic, which counts element bytes only
    assert p.blocks * 16 * (p.bytes_per_token - p.scale_bytes_per_token) == memory.kv_pool_bytes(
        "smollm2-135m", 3, 100, "int8", 40, block_size=16)


def test_scales_counted_per_format():
    # smollm2-135m: 30 layers x 3 KV heads x 2 (K, V) = 180 vectors per token of d_head = 64
    assert plan("smollm2-135m", "fp8", 1, 1, pool_gib=1).bytes_per_token == 180 * (64 + 2)
    assert plan("smollm2-135m", "int8", 1, 1, pool_gib=1).bytes_per_token == 180 * (64 + 2 * 2)
    assert plan("smollm2-135m", "int4", 1, 1, pool_gib=1).bytes_per_token == 180 * (32 + 2 * 2)
    assert plan("smollm2-135m", "fp32", 1, 1, pool_gib=1).bytes_per_token == 180 * 64 * 4


def _allocate(p: Plan, users: int) -> BlockManager | None:
    """A block manager of the plan's pool holding the shared blocks once (seq -1) and ``users`` tails;
    None if it runs out of blocks. Models prefix sharing without the manager's own prefix cache."""
    bm = BlockManager(num_blocks=p.pool_blocks, block_size=p.block_size)
    tail = p.context - p.shared_blocks * p.block_size
    seqs = [(-1, p.shared_blocks * p.block_size)] if p.shared_blocks else []
    for seq_id, tokens in seqs + [(i, tail) for i in range(users)]:
        if not bm.can_allocate(seq_id, tokens):
            return None
        bm.allocate(seq_id, tokens)
    bm.check_invariants()
    return bm


@pytest.mark.parametrize("kwargs", [
    CAPSTONE,
    dict(model="smollm2-135m", kv_dtype="int4", users=5, context=1000, shared_prefix=333, block_size=32,
         pool_bytes=10**8),
    dict(model="llama-2-7b", kv_dtype="fp16", users=12, context=8192, pool_gib=48),
])
def test_agrees_with_block_manager(kwargs):
    p = plan(**kwargs)
    bm = _allocate(p, p.users)
    assert bm is not None and bm.num_used_blocks == p.blocks
    full = _allocate(p, p.max_users)
    assert full is not None and full.num_used_blocks == p.shared_blocks + p.max_users * p.per_user_blocks
    assert _allocate(p, p.max_users + 1) is None


def test_block_manager_refuses_what_does_not_fit():
    p = plan("llama-2-7b", "fp16", 64, 8192, pool_gib=48)
    assert not p.fits and _allocate(p, p.users) is None and _allocate(p, p.max_users) is not None


@st.composite
def inputs(draw):
    model = draw(st.sampled_from(["smollm2-135m", "llama-3-8b"]))
    kv_dtype = draw(st.sampled_from(list(quant.FORMATS)))
    block_size = draw(st.integers(1, 64))
    context = draw(st.integers(1, 2000))
    shared_prefix = draw(st.integers(0, context - 1))
    block_bytes = block_size * quant.pool_bytes_per_token(model, kv_dtype)
    pool_bytes = draw(st.integers(1, 400)) * block_bytes + draw(st.integers(0, block_bytes - 1))
    return dict(model=model, kv_dtype=kv_dtype, users=draw(st.integers(1, 60)), context=context,
                shared_prefix=shared_prefix, block_size=block_size, pool_bytes=pool_bytes)


@settings(max_examples=80, deadline=None)
@given(inputs())
def test_properties(kw):
    p = plan(**kw)
    assert p.pool_blocks == kw["pool_bytes"] // p.block_bytes
    assert p.bytes == p.blocks * p.block_bytes
    assert p.fits == (p.blocks <= p.pool_blocks) == (p.headroom_bytes >= 0)
    assert p.headroom_bytes == p.pool_blocks * p.block_bytes - p.bytes
    assert p.naive_bytes <= p.bytes  # blocks round up, scales add, only full prefix blocks are shared
    assert p.blocks * p.block_size * (p.bytes_per_token - p.scale_bytes_per_token) == memory.kv_pool_bytes(
        kw["model"], kw["users"], kw["context"], kw["kv_dtype"], kw["shared_prefix"], kw["block_size"])
    if p.max_users >= 1:
        assert plan(**{**kw, "users": p.max_users}).fits
    assert not plan(**{**kw, "users": p.max_users + 1}).fits
    assert (_allocate(p, p.users) is not None) == p.fits


def _odd_head_dim_model():
    return dataclasses.replace(get_model("smollm2-135m"), name="odd-head-dim", head_dim=48, num_params=None)


@pytest.mark.parametrize("change, word", [
    (dict(model="gpt-9"), "unknown model"), (dict(kv_dtype="fp7"), "kv_dtype"), (dict(users=0), "users"),
    (dict(users=-1), "users"), (dict(users=1.5), "users"), (dict(users=True), "users"),
    (dict(context=0), "context"), (dict(context=-3), "context"), (dict(context=8192.0), "context"),
    (dict(shared_prefix=-1), "shared_prefix"), (dict(shared_prefix=8193), "shared_prefix"),
    (dict(shared_prefix=8192), "shared_prefix"), (dict(block_size=0), "block_size"),
    (dict(pool_gib=None), "pool_gib or pool_bytes"), (dict(pool_bytes=48 * GiB), "pool_gib or pool_bytes"),
    (dict(pool_gib=0), "pool_gib"), (dict(pool_gib=-1), "pool_gib"),
    (dict(pool_gib=float("nan")), "pool_gib"), (dict(pool_gib=float("inf")), "pool_gib"),
    (dict(pool_gib=None, pool_bytes=0), "pool_bytes"), (dict(pool_gib=None, pool_bytes="1G"), "pool_bytes"),
    (dict(pool_gib=None, pool_bytes=1_000_000), "holds no block of 16 tokens"),
    (dict(model=_odd_head_dim_model(), kv_dtype="int8"), "head_dim"),
])
def test_bad_input_raises(change, word):
    with pytest.raises(ValueError, match=word):
        plan(**{**CAPSTONE, **change})


CLI_ARGS = ["plan", "--model", "llama-3-8b", "--kv-dtype", "fp8", "--users", "64", "--context", "8K",
            "--shared-prefix", "2K", "--pool-gib", "48"]


def test_cli_json_matches_plan(capsys):
    assert main([*CLI_ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(json.dumps(plan(**CAPSTONE).to_dict()))
    assert {"bytes_per_token", "blocks", "bytes", "fits", "max_users", "headroom_bytes"} <= out.keys()
    assert (out["bytes_per_token"], out["blocks"], out["fits"], out["max_users"]) == (
        66_560, 24_704, True, 125,
    )


def test_cli_table(capsys):
    assert main(CLI_ARGS) == 0
    out = capsys.readouterr().out
    assert "fits" in out and "yes" in out and "24,704 / 48,395" in out and "24.125 GiB" in out
    assert main(["plan", "--model", "llama-2-7b", "--kv-dtype", "fp16", "--users", "64", "--context", "8192",
                 "--pool-gib", "48"]) == 0
    out = capsys.readouterr().out
    assert "NO" in out and "shortfall" in out


def test_cli_value_error_is_one_line(capsys):
    assert main([*CLI_ARGS[:6], "0", *CLI_ARGS[7:]]) == 2  # --users 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "users" in err


def test_cli_bad_kv_dtype_exit_2_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [a if a != "fp8" else "fp7" for a in CLI_ARGS]
    r = subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "--kv-dtype" in r.stderr and "fp7" in r.stderr
