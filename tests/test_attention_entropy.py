"""Attention entropy: the formulas, and the model's probe hook (a no-op when off, correct when on)."""

import math

import numpy as np
import pytest

from longctx.evals.attention import AttentionProbe, entropy_nats, random_logits_entropy


def test_entropy_of_uniform_one_hot_and_two_point():
    for T in (1, 7, 1000):
        assert entropy_nats(np.full(T, 1 / T)) == pytest.approx(math.log(T))
    assert entropy_nats([0, 0, 1, 0]) == 0.0
    assert entropy_nats([[0.5, 0.5], [0.9, 0.1]]) == pytest.approx([math.log(2), 0.3250829733914482])


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_random_logits_entropy_grows_like_ln_T(sigma):
    """For i.i.d. Normal(0, sigma^2) logits, H ~ ln T - sigma^2 / 2 at large T: diffuse, like uniform."""
    for T in (1024, 8192):
        assert random_logits_entropy(T, sigma, num_samples=16) == pytest.approx(
            math.log(T) - sigma**2 / 2, abs=0.05
        )
    # sharper logits: the gap below ln T grows with sigma but stays constant in T (slow convergence)
    gaps = [math.log(T) - random_logits_entropy(T, 2.0, num_samples=16) for T in (1024, 8192)]
    assert 1.2 < gaps[0] < 2.0 and abs(gaps[1] - gaps[0]) < 0.3


def test_probe_weights_on_a_toy_query():
    import torch

    probe = AttentionProbe([2])
    q = torch.zeros(3, 2, 4)  # n=3 queries, 2 heads, d=4
    q[2, 0, 0] = 10.0  # head 0 of query 2 looks along dim 0; head 1 sees all-zero scores (uniform)
    keys = torch.zeros(1, 1, 3, 4)  # one kv head shared by both query heads (GQA)
    keys[0, 0, 1, 0] = 1.0
    probe(q, keys)
    w = probe.records[2]
    assert w.shape == (2, 3)
    e5 = math.exp(10.0 / 2)  # scale 1/sqrt(4)
    np.testing.assert_allclose(w[0], [1 / (e5 + 2), e5 / (e5 + 2), 1 / (e5 + 2)], rtol=1e-5)
    np.testing.assert_allclose(w[1], [1 / 3] * 3, rtol=1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        AttentionProbe([-1])


@pytest.mark.slow
def test_hook_is_a_no_op_when_off_and_measures_when_on():
    import torch
    from model_fixtures import our_model, our_tokenizer

    from longctx.evals.attention import measure_attention, probes
    from longctx.evals.haystack import natural_text
    from longctx.evals.perplexity import token_nll

    model, tok = our_model(), our_tokenizer()
    ids = tok.encode(natural_text())[:256]
    assert all(block.attn.probe is None for block in model.layers)  # off by default
    before = token_nll(model, ids, chunk_size=256)
    with probes(model, [0, 15], [255]) as installed:
        during = token_nll(model, ids, chunk_size=256)
        assert 255 in installed[15].records
    after = token_nll(model, ids, chunk_size=256)
    assert before == during == after  # bit-identical: recording changes nothing
    assert all(block.attn.probe is None for block in model.layers)  # removed again

    rows = measure_attention(model, ids, [0, 2, 15], [15, 255])
    assert len(rows) == 3 * 2 * model.config.num_heads
    for r in rows:
        assert 0 <= r["entropy"] <= r["uniform_entropy"] + 1e-9
        assert r["uniform_entropy"] == pytest.approx(math.log(r["T"]))
        assert 1 / r["T"] - 1e-6 <= r["max_weight"] <= 1 + 1e-6
    deep = [r for r in rows if r["layer"] == 15 and r["T"] == 256]
    assert min(r["entropy"] for r in deep) < 0.8 * math.log(256)  # real heads are not all near-uniform
    with pytest.raises(ValueError, match="layer 99 does not exist"):
        measure_attention(model, ids, [99], [10])
    assert all(block.attn.probe is None for block in model.layers)
    assert torch.is_grad_enabled()
