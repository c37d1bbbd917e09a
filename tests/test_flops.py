"""FLOPs: the source's Exercises 1 and 2 (seed 003), its erratum, and exact invariants."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from longctx.flops import (
    attention_flops,
    attention_pairs,
    attention_share,
    chunk_flops,
    crossover_tokens,
    decode_flops,
    linear_flops,
    linear_params,
    lm_head_params,
    prefill_flops,
    source_seed_attention_flops,
    source_seed_attention_share,
    source_seed_linear_flops,
    step_cost,
    tokens_for_attention_share,
)
from longctx.memory import kv_bytes_per_token
from longctx.specs import get_model

T7 = "teaching-7b-mha"


def test_exercise1_prefill_flops():
    assert linear_flops(T7, 12_000) == 2 * 12_000 * 7_000_000_000 == 1.68e14
    assert source_seed_linear_flops(12_000) == 1.68e14
    assert linear_flops(T7, 12_000) / 150e12 == pytest.approx(1.12)  # seconds at 150 TFLOP/s
    assert linear_flops(T7, 1_000) == 14e12  # per chunk


# seed 003 Exercise 2 / §3.2 table, reproduced with its own formula (no causal halving)
@pytest.mark.parametrize(
    "t, linear_tf, attention_tf, share",
    [
        (4096, 57.34, 8.80, 0.133),
        (32768, 458.8, 562.9, 0.551),  # the seed prints 563.2: erratum 2
        (131072, 1835.0, 9007.0, 0.831),
        (1048576, 14680.0, 576460.0, 0.975),
    ],
)
def test_exercise2_seed_formula(t, linear_tf, attention_tf, share):
    assert source_seed_linear_flops(t) / 1e12 == pytest.approx(linear_tf, rel=1e-3)
    assert source_seed_attention_flops(t) / 1e12 == pytest.approx(attention_tf, rel=1e-3)
    assert source_seed_attention_share(t) == pytest.approx(share, abs=5e-4)
    # the seed's formula is our full attention for the 7B teaching model
    assert attention_flops(T7, t, "full") == source_seed_attention_flops(t)
    assert attention_share(T7, t, "full") == pytest.approx(share, abs=5e-4)


def test_seed_32k_misprint():
    assert source_seed_attention_flops(32768) / 1e12 == pytest.approx(562.95, abs=0.01)


@pytest.mark.parametrize(
    "t, share", [(4096, 0.0712), (32768, 0.3803), (131072, 0.7105), (1048576, 0.9515)]
)
def test_corrected_causal_shares(t, share):
    assert attention_share(T7, t, "causal") == pytest.approx(share, abs=1e-4)


def test_crossover_7b():
    full, causal = crossover_tokens(T7, "full"), crossover_tokens(T7, "causal")
    assert full == pytest.approx(7e9 / (2 * 32 * 4096))  # 26,702.9
    assert causal == pytest.approx(7e9 / (32 * 4096) - 1)  # 53,404.8
    assert round(full) == 26_703 and round(causal) == 53_405
    for kind, t in (("full", full), ("causal", causal)):
        # attention < linear just below the crossover, > just above
        lo, hi = prefill_flops(T7, int(t), kind), prefill_flops(T7, int(t) + 1, kind)
        assert lo.attention_flops <= lo.linear_flops and hi.attention_flops > hi.linear_flops


def test_llama3_crossover_with_real_n():
    # the course's convention (matmul weights, LM head on the last token) moves it to ~53K (issue 12)
    assert round(crossover_tokens("llama-3-8b", "causal")) == 53_247
    # the source's 2*T*N with every parameter (embeddings included) gives ~61K
    assert round(crossover_tokens("llama-3-8b", "causal", params="all")) == 61_265
    for kind in ("causal", "full"):
        t = crossover_tokens("llama-3-8b", kind)
        lo, hi = prefill_flops("llama-3-8b", int(t), kind), prefill_flops("llama-3-8b", int(t) + 1, kind)
        assert lo.attention_flops <= lo.linear_flops and hi.attention_flops > hi.linear_flops


def test_param_conventions():
    m = get_model("llama-3-8b")
    assert linear_params(m, "all") == m.num_params
    # q, k, v, o and the MLP of 32 layers: no embedding, no LM head, no norms
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert linear_params(m, "matmul") == 32 * per_layer == 6_979_321_856
    assert lm_head_params(m) == 128256 * 4096
    assert m.num_params == linear_params(m) + 2 * lm_head_params(m) + 65 * 4096  # + 2 tables + 65 norms
    tied = get_model("smollm2-135m")
    assert linear_params(tied) + lm_head_params(tied) + 61 * 576 == tied.num_params  # one shared table
    # the teaching model has only a round N: it is all "matmul", with no separable LM head
    assert linear_params(T7, "matmul") == 7e9 and lm_head_params(T7) == 0
    with pytest.raises(ValueError, match="matmul, all"):
        linear_params(m, "some")


def test_linear_flops_convention():
    m = get_model("llama-3-8b")
    n, head = linear_params(m), lm_head_params(m)
    assert linear_flops(m, 1000) == 2 * 1000 * n + 2 * head  # logits of the last token only
    assert linear_flops(m, 1000, logit_tokens=1000) == 2 * 1000 * (n + head)  # every row's logits
    assert linear_flops(m, 1000, logit_tokens=0) == 2 * 1000 * n  # a chunk that does not end its prompt
    assert linear_flops(m, 0) == 0
    assert linear_flops(m, 1000, "all") == 2 * 1000 * m.num_params
    assert linear_flops(T7, 12_000) == linear_flops(T7, 12_000, "all")
    with pytest.raises(ValueError, match="logit_tokens"):
        linear_flops(m, 3, logit_tokens=4)
    # chunks that do not end the prompt compute no logits: 12 chunks add up to the monolithic prefill
    chunks = [chunk_flops(m, 1000, 1000 * i, logit_tokens=0 if i < 11 else 1) for i in range(12)]
    assert sum(c.total_flops for c in chunks) == prefill_flops(m, 12_000).total_flops


def test_tokens_for_attention_share():
    # the 7B model: 65 % at ~100K, 90 % only at ~480K (issue 12, item 3)
    assert attention_share(T7, 100_000) == pytest.approx(0.652, abs=1e-3)
    assert tokens_for_attention_share(T7, 0.9) == pytest.approx(480_651, abs=1)
    for model in ("llama-3-8b", "smollm2-135m", T7):
        for kind in ("causal", "full"):
            assert tokens_for_attention_share(model, 0.5, kind) == pytest.approx(
                crossover_tokens(model, kind)
            )
            for share in (0.1, 0.65, 0.97):
                t = tokens_for_attention_share(model, share, kind)
                assert (
                    attention_share(model, int(t), kind) <= share < attention_share(model, int(t) + 1, kind)
                )
    for bad in (0, 1, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="between 0 and 1"):
            tokens_for_attention_share(T7, bad)


def test_attention_must_be_named():
    with pytest.raises(ValueError, match="causal, full"):
        attention_flops(T7, 10, "sparse")


def test_chunks_sum_to_prefill():
    # causal attention of 12 chunks of 1,000 tokens = one 12,000-token prefill
    total = sum(attention_flops(T7, 1000, "causal", cached_tokens=1000 * i) for i in range(12))
    assert total == attention_flops(T7, 12_000, "causal")
    assert attention_pairs(3, 5) == 6 + 7 + 8


def test_decode_step():
    d = decode_flops("llama-3-8b", 8191)
    assert d.attention_flops == 4 * 32 * 4096 * 8192
    assert d.linear_flops == 2 * (linear_params("llama-3-8b") + lm_head_params("llama-3-8b"))
    assert decode_flops("llama-3-8b", 8191, "all").linear_flops == 2 * get_model("llama-3-8b").num_params


def test_step_cost_bytes():
    m = get_model("llama-3-8b")
    c = step_cost(m, [(1, 8192)] * 16 + [(1000, 3000)], weight_dtype="bf16", kv_dtype="fp8")
    bpt = kv_bytes_per_token(m, "fp8")
    assert c.weight_bytes == 2 * (m.num_params - 128256 * 4096)  # the input table is looked up, not read
    assert step_cost(m, [(1, 10)], params="all").weight_bytes == 2 * m.num_params
    assert c.kv_read_bytes == (16 * 8192 + 3000) * bpt
    assert c.kv_write_bytes == 1016 * bpt
    assert c.flops == 16 * decode_flops(m, 8192).total_flops + chunk_flops(m, 1000, 3000).total_flops
    assert c.bytes == c.weight_bytes + c.kv_read_bytes + c.kv_write_bytes


def test_negative_tokens_rejected():
    with pytest.raises(ValueError, match=">= 0"):
        prefill_flops(T7, -1)
    with pytest.raises(ValueError, match=">= 0"):
        chunk_flops(T7, 10, -1)


models = st.sampled_from(["llama-2-7b", "llama-3-8b", "llama-3.1-70b", "mistral-7b", "smollm2-135m", T7])
sizes = st.integers(0, 2**21)


@given(models, sizes)
def test_causal_is_half_full_plus_diagonal(model, t):
    m = get_model(model)
    full, causal = attention_flops(m, t, "full"), attention_flops(m, t, "causal")
    assert 2 * causal == full + 4 * m.d_attn * t * m.num_layers
    assert causal == 4 * m.d_attn * m.num_layers * t * (t + 1) // 2


@given(models, sizes, sizes, st.sampled_from(["causal", "full"]))
def test_monotone(model, t, s, kind):
    a = chunk_flops(model, t, s, kind)
    assert a.linear_flops <= chunk_flops(model, t + 1, s, kind).linear_flops
    assert a.attention_flops <= chunk_flops(model, t + 1, s, kind).attention_flops
    assert a.attention_flops <= chunk_flops(model, t, s + 1, kind).attention_flops
    assert attention_flops(model, t, "causal", s) <= attention_flops(model, t, "full", s)


@given(models, st.integers(1, 2**20), st.integers(1, 2**20))
def test_causal_chunking_is_exact(model, s, c):
    assert attention_flops(model, s, "causal") + attention_flops(model, c, "causal", s) == attention_flops(
        model, s + c, "causal"
    )


@given(models, st.integers(1, 2**22))
def test_share_increases_with_length(model, t):
    assert attention_share(model, t) < attention_share(model, t + 1)
