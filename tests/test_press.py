"""KV presses (longctx.kv.press) keep exactly the tokens their papers say, and the base class's contract
holds for every press: a new press is one subclass plus one line in PRESS_CASES."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.kv.press import (
    PRESSES,
    H2OPress,
    KnormPress,
    PressInput,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    attention_weights,
    compact,
    make_press,
)

# name -> options that make the press valid on the prompts below (T >= 8)
PRESS_CASES = {"streaming_llm": {}, "snapkv": {"window_size": 4}, "h2o": {}, "random": {"seed": 3}, "knorm": {}}


def test_every_press_is_in_the_shared_matrix():
    assert set(PRESS_CASES) == set(PRESSES)


def _inputs(press, T, num_kv_heads=2, group=3, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(num_kv_heads, T, d, generator=gen)
    values = torch.randn(num_kv_heads, T, d, generator=gen)
    n = T if press.uses_attention_sum else press.query_window
    queries = torch.randn(num_kv_heads * group, n, d, generator=gen) if n else None
    return PressInput(keys, values, queries)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(PRESS_CASES)), T=st.integers(8, 80), ratio=st.floats(0.0, 0.95),
       seed=st.integers(0, 5))
def test_contract_of_every_press(name, T, ratio, seed):
    press = make_press(name, ratio, **PRESS_CASES[name])
    inp = _inputs(press, T, seed=seed)
    keep = press.keep_indices(inp)
    protected = press.protected(T, press.num_kept(T))
    expected = max(T - math.floor(ratio * T), int(protected.sum()))
    assert keep.shape == (2, expected)
    for head in keep:
        assert torch.all(head[1:] > head[:-1]), "ascending, no token twice"
        assert 0 <= int(head[0]) and int(head[-1]) < T
        assert set(torch.nonzero(protected).flatten().tolist()) <= set(head.tolist()), "protected tokens are kept"


@pytest.mark.parametrize("name", sorted(PRESS_CASES))
def test_ratio_zero_keeps_every_token(name):
    press = make_press(name, 0.0, **PRESS_CASES[name])
    keep = press.keep_indices(_inputs(press, 24))
    assert torch.equal(keep, torch.arange(24).expand(2, 24))


def test_streaming_llm_keeps_sinks_and_the_recent_window():
    press = StreamingLLMPress(0.5)  # 20 tokens -> keep 10: 4 sinks + the 6 most recent
    keep = press.keep_indices(_inputs(press, 20))
    assert keep.tolist() == [[0, 1, 2, 3, 14, 15, 16, 17, 18, 19]] * 2
    assert StreamingLLMPress().n_sink == 4, "the paper's default is 4 sinks (not 32)"


def test_snapkv_keeps_what_the_window_attends_to_per_kv_head():
    T, d = 32, 8
    keys = torch.zeros(2, T, d)
    keys[0, 5, 0] = keys[1, 11, 1] = 10.0  # KV head 0's window attends to token 5, head 1's to token 11
    queries = torch.zeros(6, 4, d)  # 3 query heads per KV head, window of 4
    queries[:3, :, 0] = queries[3:, :, 1] = 1.0
    press = SnapKVPress(0.75, window_size=4, kernel_size=1)  # keep 8: the window's 4 + 4 by score
    keep = press.keep_indices(PressInput(keys, torch.zeros(2, T, d), queries))
    assert 5 in keep[0].tolist() and 11 not in keep[0].tolist()
    assert 11 in keep[1].tolist() and 5 not in keep[1].tolist()
    assert keep[:, -4:].tolist() == [[28, 29, 30, 31]] * 2, "the observation window is always kept"


def test_snapkv_pooling_keeps_the_neighbours_of_a_hit():
    T, d = 40, 4
    keys = torch.zeros(1, T, d)
    keys[0, 10, 0] = 8.0
    queries = torch.zeros(1, 4, d)
    queries[0, :, 0] = 1.0
    press = SnapKVPress(1 - 9 / T, window_size=4, kernel_size=5)  # keep 9: window 4 + 5 pooled around 10
    keep = press.keep_indices(PressInput(keys, torch.zeros(1, T, d), queries))
    assert keep[0].tolist()[:5] == [8, 9, 10, 11, 12]


def test_h2o_keeps_heavy_hitters_and_the_recent_tokens():
    T, d = 30, 4
    keys = torch.zeros(1, T, d)
    keys[0, 7, 0] = 6.0
    queries = torch.zeros(1, T, d)
    queries[0, :, 0] = 1.0
    press = H2OPress(0.8)  # keep 6: 3 recent + 3 heavy (7, then the earliest tokens, seen by most queries)
    keep = press.keep_indices(PressInput(keys, torch.zeros(1, T, d), queries))[0].tolist()
    assert 7 in keep and keep[-3:] == [27, 28, 29]


def test_h2o_reads_an_accumulated_attention_sum_like_its_queries():
    gen = torch.Generator().manual_seed(1)
    keys, queries = torch.randn(2, 20, 8, generator=gen), torch.randn(4, 20, 8, generator=gen)
    press = H2OPress(0.6)
    from_queries = press.keep_indices(PressInput(keys, keys.clone(), queries))
    summed = attention_weights(queries[:, :12], keys[:, :12]).sum(1)  # a first chunk of 12 queries ...
    summed = torch.nn.functional.pad(summed, (0, 8)) + attention_weights(queries[:, 12:], keys).sum(1)  # + 8
    assert torch.equal(press.keep_indices(PressInput(keys, keys.clone(), attention_sum=summed)), from_queries)


def test_knorm_keeps_the_smallest_keys():
    keys = torch.arange(1.0, 11.0)[None, :, None].expand(1, 10, 4).clone()
    keys[0, 6] = 0.01
    keep = KnormPress(0.7).keep_indices(PressInput(keys, keys.clone()))
    assert keep.tolist() == [[0, 1, 6]]


def test_random_is_seeded():
    inp = _inputs(RandomPress(0.5), 50)
    assert torch.equal(RandomPress(0.5, seed=1).keep_indices(inp), RandomPress(0.5, seed=1).keep_indices(inp))
    assert not torch.equal(RandomPress(0.5, seed=1).keep_indices(inp), RandomPress(0.5, seed=2).keep_indices(inp))


def test_attention_weights_match_a_naive_causal_softmax():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, 5, 8, generator=gen), torch.randn(2, 12, 8, generator=gen)
    got = attention_weights(q, k, tile_rows=2)
    for h in range(4):
        for j in range(5):
            pos = 12 - 5 + j
            s = (k[h // 2, : pos + 1] @ q[h, j]) / math.sqrt(8)
            want = torch.zeros(12)
            want[: pos + 1] = s.softmax(-1)
            assert torch.allclose(got[h, j], want, atol=1e-6)


def test_compact_gathers_each_heads_tokens():
    t = torch.arange(2 * 6 * 3, dtype=torch.float32).view(2, 6, 3)
    out = compact(t, torch.tensor([[0, 4], [1, 5]]))
    assert torch.equal(out[0], t[0, [0, 4]]) and torch.equal(out[1], t[1, [1, 5]])


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5, float("nan")])
def test_bad_ratio_is_refused(ratio):
    with pytest.raises(ValueError, match=r"compression_ratio must be in \[0, 1\)"):
        make_press("knorm", ratio)


def test_bad_names_and_options_are_refused():
    with pytest.raises(ValueError, match="unknown press 'snap'; allowed: streaming_llm, snapkv"):
        make_press("snap", 0.5)
    with pytest.raises(ValueError, match="window .* larger than the prompt"):
        SnapKVPress(0.5, window_size=64).check_prompt(40)
    with pytest.raises(ValueError, match="kernel_size must be an odd"):
        SnapKVPress(0.5, kernel_size=4)
    with pytest.raises(ValueError, match="n_sink"):
        StreamingLLMPress(0.5, n_sink=-1)
    with pytest.raises(ValueError, match="SnapKV needs the last 4 prompt queries"):
        SnapKVPress(0.5, window_size=4).keep_indices(PressInput(torch.zeros(1, 10, 4), torch.zeros(1, 10, 4)))
    with pytest.raises(ValueError, match="queries must be"):
        PressInput(torch.zeros(2, 10, 4), torch.zeros(2, 10, 4), torch.zeros(3, 2, 4))
