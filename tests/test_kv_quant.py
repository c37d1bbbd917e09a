"""KV quantization in the paged cache (longctx.kv.quant, longctx.kv.cache): round-trip errors within each
format's bound, the pool's real bytes equal the planner's, a monolithic prefill writes exactly the quantized
fp32 keys, and decoding works with chunked prefill, preemption and KV pruning.

On a tiny random-weight Llama with head_dim 32 (one scale group); the real model's costs are in
benchmarks/capstone.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.block_manager import BlockManager
from longctx.kv.cache import EncodedKV, PagedKVCache
from longctx.kv.press import make_press
from longctx.kv.quant import FORMATS, dequantize, error_bound, get_format, pool_bytes_per_token, quantize
from longctx.model.llama import Llama
from longctx.specs import ModelSpec, get_model

SPEC = ModelSpec(name="tiny32", num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=32,
                 source="test", intermediate_size=96, vocab_size=60, rope_theta=10000.0, max_context=512)
QUANTIZED = ["fp8", "int8", "int4"]
BS = 4


@pytest.fixture(scope="module")
def model():
    return Llama(SPEC).init_random_(seed=5, std=0.3).eval()


def _prompt(n, seed=0):
    return torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(QUANTIZED), rows=st.integers(1, 20), magnitude=st.floats(1e-6, 1e4),
       seed=st.integers(0, 10_000), zero_row=st.booleans())
def test_round_trip_error_within_the_formats_bound(name, rows, magnitude, seed, zero_row):
    fmt = get_format(name)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, 64, generator=g) * magnitude * torch.rand(rows, 3, 1, generator=g)
    if zero_row:
        x[0] = 0.0  # an all-zero group: scale 0, decoded exactly
    codes, scales = quantize(x, fmt)
    assert codes.dtype == torch.uint8 and scales.dtype == torch.float16
    assert codes.shape[-1] == 64 * fmt.bits // 8  # int4: two numbers per byte
    assert scales.shape[-1] == fmt.groups(64)
    y = dequantize(codes, scales, fmt, torch.float32)
    assert torch.isfinite(y).all()
    assert ((x - y).abs() <= error_bound(x, fmt)).all()
    if zero_row:
        assert torch.equal(y[0], x[0])
    # writing back what was read changes nothing (KV pruning moves entries by reading and writing them),
    # while the fp16 scales are normal numbers (>= 2^-14; tiny subnormal scales round again)
    if ((scales == 0) | (scales >= 2**-14)).all():
        codes2, scales2 = quantize(y, fmt)
        assert torch.equal(codes2, codes) and torch.equal(scales2, scales)


def test_int4_codes_use_the_whole_range_symmetrically():
    fmt = get_format("int4")
    x = torch.linspace(-7, 7, 32).repeat(1, 1)  # one group, amax 7: scale 1, codes -7..7
    y = dequantize(*quantize(x, fmt), fmt, torch.float32)
    assert torch.allclose(y, x.round(), atol=1e-3)


@pytest.mark.parametrize("kv_dtype", list(FORMATS))
@pytest.mark.parametrize("model_name", ["smollm2-135m", "llama-3-8b"])
def test_the_pools_real_bytes_are_the_planners(model_name, kv_dtype):
    cache = PagedKVCache.for_model(get_model(model_name), num_blocks=2, block_size=16, kv_dtype=kv_dtype)
    assert cache.bytes_per_token == pool_bytes_per_token(model_name, kv_dtype)
    assert cache.nbytes == 2 * 16 * pool_bytes_per_token(model_name, kv_dtype)


def test_fp8_on_llama3_costs_its_scales_and_int4_a_quarter():
    fp16 = pool_bytes_per_token("llama-3-8b", "fp16")
    assert fp16 == 131_072
    assert pool_bytes_per_token("llama-3-8b", "fp8") == 2 * 32 * 8 * (128 + 2)  # 1.6 % over half
    assert pool_bytes_per_token("llama-3-8b", "int4") == 2 * 32 * 8 * (64 + 4 * 2)


def test_a_bad_kv_dtype_says_what_is_allowed(model):
    with pytest.raises(ValueError, match="unknown kv_dtype 'fp4'.*fp8.*int4"):
        TorchExecutor(model, BlockManager(8, BS), kv_dtype="fp4")
    odd = ModelSpec(
        name="odd", num_layers=1, d_model=48, num_heads=1, num_kv_heads=1, head_dim=48, source="t",
        intermediate_size=8, vocab_size=10, rope_theta=1e4, max_context=64,
    )
    with pytest.raises(ValueError, match="does not divide head_dim=48.*fp8"):
        pool_bytes_per_token(odd, "int8")


def _run(model, prompts, max_tokens, kv_dtype=None, scheduler=None, num_blocks=128, press=None):
    executor = TorchExecutor(model, BlockManager(num_blocks, BS), kv_dtype=kv_dtype, press=press)
    engine = Engine(executor, scheduler or MonolithicScheduler(), max_model_len=512)
    seqs = [engine.add_request(p, max_tokens, arrival_s=0.0) for p in prompts]
    engine.run_until_done()
    engine.block_manager.check_invariants()
    return [s.output_token_ids for s in seqs], engine


@pytest.mark.parametrize("kv_dtype", QUANTIZED)
def test_a_monolithic_prefill_stores_exactly_the_quantized_keys(model, kv_dtype):
    prompt = _prompt(37)
    out_ref, ref = _run(model, [prompt], 1, kv_dtype="fp32")  # the pool of an fp32 model, stored plainly
    out_q, quant = _run(model, [prompt], 1, kv_dtype=kv_dtype)
    assert out_q == out_ref  # the prefill attends to its fresh keys: the first token is the same
    fmt = get_format(kv_dtype)
    slots = torch.arange(37)  # one sequence from block 0: slots 0..36
    for layer in range(SPEC.num_layers):
        for plain, encoded in zip(
            ref.executor.cache.flat(layer), quant.executor.cache.flat(layer), strict=True
        ):
            assert isinstance(encoded, EncodedKV) and not isinstance(plain, EncodedKV)
            expected = dequantize(*quantize(plain[slots], fmt), fmt, torch.float32)
            assert torch.equal(encoded[slots], expected)


@pytest.mark.parametrize("kv_dtype", ["bf16", *QUANTIZED])
def test_decoding_over_a_quantized_cache_is_deterministic(model, kv_dtype):
    prompts = [_prompt(50, seed=1), _prompt(23, seed=2)]
    out_q, _ = _run(model, prompts, 6, kv_dtype=kv_dtype, scheduler=ChunkedPrefillScheduler(16))
    again, _ = _run(model, prompts, 6, kv_dtype=kv_dtype, scheduler=ChunkedPrefillScheduler(16))
    assert again == out_q and all(len(o) == 6 for o in out_q)


def test_log_likelihood_error_grows_as_the_format_shrinks(model):
    """Teacher forcing in chunks of 16 (later chunks read the quantized keys back): the first chunk is exact,
    and the mean |change in NLL| orders bf16 < int8 < fp8 < int4, each within a loose bound (a random-weight
    model is far more sensitive than SmolLM2, whose numbers are in benchmarks/capstone.py)."""
    from longctx.evals.perplexity import token_nll

    prompt = _prompt(50, seed=1)
    exact = torch.tensor(token_nll(model, prompt, chunk_size=16, block_size=BS))
    mean_error = {}
    for kv_dtype, bound in {"bf16": 0.04, "int8": 0.12, "fp8": 0.5, "int4": 1.5}.items():
        approx = torch.tensor(token_nll(model, prompt, chunk_size=16, block_size=BS, kv_dtype=kv_dtype))
        assert torch.equal(exact[:15], approx[:15])  # the first chunk attends to its fresh keys
        mean_error[kv_dtype] = (exact - approx)[15:].abs().mean().item()
        assert 0 < mean_error[kv_dtype] < bound
    assert list(mean_error) == sorted(mean_error, key=mean_error.get)


def test_preemption_and_pruning_work_over_a_quantized_cache(model):
    prompts = [_prompt(20, seed=s) for s in range(4)]
    # 16 blocks of 4: two 20-token prompts start, then grow by 24 tokens each: one is preempted, recomputed
    out, engine = _run(
        model, prompts, 24, kv_dtype="int8", scheduler=ChunkedPrefillScheduler(32), num_blocks=16
    )
    assert sum(s.num_preemptions for s in engine.finished) > 0
    assert all(len(o) == 24 for o in out) and engine.block_manager.num_free_blocks == 16
    press = make_press("snapkv", 0.5, window_size=8)
    out_p, engine = _run(model, [_prompt(40)], 4, kv_dtype="int4", press=press)
    seq = engine.finished[0]
    assert seq.num_evicted_tokens == 20 and len(out_p[0]) == 4
