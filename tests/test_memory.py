"""KV memory: the source's hand-worked numbers (seed 003 §3.1 and Exercise 3) and invariants."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longctx.memory import (
    GB,
    GiB,
    KiB,
    blocks_needed,
    kv_bytes_per_request,
    kv_bytes_per_token,
    kv_pool,
    kv_pool_bytes,
    max_concurrent_requests,
    max_context_tokens,
    padded_tokens,
    to_gb,
    to_gib,
)
from longctx.specs import ModelSpec, get_model


def test_units():
    assert GiB == 2**30 and GB == 10**9 and KiB == 1024
    assert to_gib(GiB) == 1 and to_gb(GB) == 1


def test_bytes_per_token_capstone():
    assert kv_bytes_per_token("llama-2-7b", "fp16") == 524_288 == 512 * KiB
    assert kv_bytes_per_token("llama-3-8b", "fp16") == 131_072 == 128 * KiB
    assert kv_bytes_per_token("llama-3-8b", "fp8") == 64 * KiB
    assert kv_bytes_per_token(get_model("smollm2-135m"), "fp32") == 2 * 30 * 3 * 64 * 4


# seed 003 §3.1 table: Llama-3-8B, GiB per sequence
@pytest.mark.parametrize(
    "tokens, fp16, fp8, int4",
    [(4096, 0.5, 0.25, 0.125), (32768, 4, 2, 1), (131072, 16, 8, 4), (1048576, 128, 64, 32)],
)
def test_llama3_context_table(tokens, fp16, fp8, int4):
    for dtype, gib in (("fp16", fp16), ("fp8", fp8), ("int8", fp8), ("int4", int4)):
        assert kv_bytes_per_request("llama-3-8b", tokens, dtype) / GiB == gib


def test_capstone():
    assert kv_pool_bytes("llama-2-7b", 64, 8192, "fp16") == 256 * GiB
    assert kv_pool_bytes("llama-3-8b", 64, 8192, "fp16") == 64 * GiB
    assert kv_pool_bytes("llama-3-8b", 64, 8192, "fp8") == 32 * GiB
    pool = kv_pool("llama-3-8b", 64, 8192, "fp8", shared_prefix_tokens=2048)
    assert pool.shared_bytes == 0.125 * GiB
    assert pool.per_request_bytes == 0.375 * GiB
    assert pool.total_bytes == 24.125 * GiB
    # 48 GiB pool: floor((48 - 0.125) / 0.375) = 127 (the source's 48 / (24.125/64) = 127.3 also gives 127)
    assert max_concurrent_requests("llama-3-8b", 48 * GiB, 8192, "fp8", 2048) == 127
    assert max_concurrent_requests("llama-3-8b", 48 * GiB, 8192, "fp8") == 96
    assert max_concurrent_requests("llama-3-8b", 48 * GiB, 8192, "fp16") == 48
    assert max_concurrent_requests("llama-2-7b", 48 * GiB, 8192, "fp16") == 12


def test_paged_blocks():
    assert blocks_needed(0, 16) == 0
    assert blocks_needed(1, 16) == 1
    assert blocks_needed(16, 16) == 1
    assert blocks_needed(17, 16) == 2
    assert padded_tokens(17, 16) == 32
    assert padded_tokens(17, None) == 17
    assert kv_bytes_per_request("llama-3-8b", 17, "fp16", block_size=16) == 32 * 128 * KiB


def test_prefix_shares_only_full_blocks():
    # 100-token prefix with 16-token blocks: 6 full blocks (96 tokens) shared, 4 tokens per request
    pool = kv_pool("llama-3-8b", 10, 200, "fp16", shared_prefix_tokens=100, block_size=16)
    bpt = kv_bytes_per_token("llama-3-8b", "fp16")
    assert pool.shared_bytes == 96 * bpt
    assert pool.per_request_bytes == 112 * bpt  # ceil(104 / 16) = 7 blocks
    # the capstone prefix (2048) is block aligned, so paging changes nothing there
    assert kv_pool_bytes("llama-3-8b", 64, 8192, "fp8", 2048, block_size=16) == 24.125 * GiB


def test_max_context():
    assert max_context_tokens("llama-3-8b", 48 * GiB, "fp8") == 786_432
    assert max_context_tokens("llama-3-8b", 48 * GiB, "fp8", num_requests=64) == 12_288
    assert max_context_tokens("llama-3-8b", 100 * 64 * KiB, "fp8", block_size=16) == 96
    assert max_concurrent_requests("llama-3-8b", 1.0, 8192) == 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: kv_bytes_per_request("llama-3-8b", -1), ">= 0"),
        (lambda: kv_bytes_per_request("llama-3-8b", 1.5), "integer"),
        (lambda: kv_bytes_per_token("llama-3-8b", "fp7"), "allowed"),
        (lambda: kv_bytes_per_token("nope"), "allowed"), (lambda: blocks_needed(10, 0), ">= 1"),
        (lambda: kv_pool("llama-3-8b", 4, 100, shared_prefix_tokens=101), "<= tokens_per_request"),
        (lambda: max_concurrent_requests("llama-3-8b", 0, 100), "> 0"),
        (lambda: max_concurrent_requests("llama-3-8b", -5.0, 100), "> 0"),
        (lambda: max_concurrent_requests("llama-3-8b", GiB, 100, shared_prefix_tokens=100), "prefix"),
        (lambda: max_context_tokens("llama-3-8b", GiB, num_requests=0), ">= 1"),
    ],
)
def test_rejects_impossible_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


dtypes = st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4"])
models = st.sampled_from(["llama-2-7b", "llama-3-8b", "llama-3.1-70b", "mistral-7b", "smollm2-135m"])
tokens = st.integers(0, 2**21)


@given(models, dtypes, tokens, tokens)
def test_linear_in_tokens(model, dtype, a, b):
    f = lambda t: kv_bytes_per_request(model, t, dtype)  # noqa: E731
    assert f(a + b) == f(a) + f(b)
    assert f(0) == 0


@given(st.integers(1, 64), st.sampled_from([1, 2, 4, 8]), st.integers(1, 256), dtypes)
def test_gqa_halving_kv_heads_halves_bytes(layers, hkv, dh, dtype):
    def spec(kv):
        return ModelSpec("t", layers, 64, 16, kv, dh, "test", num_params=1)

    assert kv_bytes_per_token(spec(2 * hkv), dtype) == 2 * kv_bytes_per_token(spec(hkv), dtype)


@given(models, tokens)
def test_dtype_ratios(model, t):
    b = {d: kv_bytes_per_request(model, t, d) for d in ("fp32", "fp16", "bf16", "fp8", "int8", "int4")}
    assert b["fp32"] == 2 * b["fp16"] == 2 * b["bf16"] == 4 * b["fp8"] == 4 * b["int8"] == 8 * b["int4"]


@given(
    models, st.integers(1, 128), st.integers(1, 32768), st.integers(0, 32768), st.sampled_from([None, 16, 32])
)
def test_pool_monotone_and_sharing_never_costs(model, n, t, prefix, block):
    prefix = min(prefix, t)
    shared = kv_pool_bytes(model, n, t, "fp16", prefix, block)
    assert shared <= kv_pool_bytes(model, n, t, "fp16", 0, block)
    assert kv_pool_bytes(model, n, t, "fp16", 0, block) <= kv_pool_bytes(model, n + 1, t, "fp16", 0, block)
    assert kv_pool_bytes(model, n, t, "fp16", 0, block) <= kv_pool_bytes(model, n, t + 1, "fp16", 0, block)
    assert kv_pool_bytes(model, n, t, "fp16") <= kv_pool_bytes(model, n, t, "fp16", 0, block or 1)


@given(models, st.integers(1, 2**40), st.integers(1, 2**17), dtypes)
def test_capacity_fits_and_is_maximal(model, budget, t, dtype):
    n = max_concurrent_requests(model, budget, t, dtype)
    assert kv_pool_bytes(model, n, t, dtype) <= budget < kv_pool_bytes(model, n + 1, t, dtype)
    c = max_context_tokens(model, budget, dtype)
    assert kv_bytes_per_request(model, c, dtype) <= budget < kv_bytes_per_request(model, c + 1, dtype)
