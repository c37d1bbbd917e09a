"""KV presses (longctx.kv.press) keep exactly the tokens their papers say, and the base class's contract
holds for every press: a new press is one subclass plus one line in PRESS_CASES."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.kv.intervention import ForcedPress
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
PRESS_CASES = {
    "streaming_llm": {}, "snapkv": {"window_size": 4}, "h2o": {}, "random": {"seed": 3}, "knorm": {},
}


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
        assert set(torch.nonzero(protected).flatten().tolist()) <= set(head.tolist()), (
            "protected tokens are kept"
        )


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
    assert not torch.equal(
        RandomPress(0.5, seed=1).keep_indices(inp), RandomPress(0.5, seed=2).keep_indices(inp)
    )


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


def _kept_sets(press, inp, calls):
    return [frozenset(press.keep_indices(inp)[0].tolist()) for _ in range(calls)]


def test_random_draws_afresh_per_layer_and_trial_and_one_seed_repeats():
    inp = _inputs(RandomPress(0.5), 64)
    press = RandomPress(0.5, seed=7)
    # successive calls: layers of one prompt, then the next
    layer0, layer1, trial2 = _kept_sets(press, inp, 3)
    assert layer0 != layer1 and layer1 != trial2, "each call draws new scores"
    again = _kept_sets(RandomPress(0.5, seed=7), inp, 3)
    assert again == [layer0, layer1, trial2], "the same seed repeats the same sequence of draws"
    other = _kept_sets(RandomPress(0.5, seed=8), inp, 3)
    assert other != again, "another seed, other draws"


def test_random_evicts_token_0_in_some_layers_and_not_others():
    """The old press evicted the same positions in every layer (token 0 in a KV head of all 30 layers)."""
    inp = _inputs(RandomPress(0.25), 1024, num_kv_heads=3)
    press = RandomPress(0.25, seed=0)
    # per layer, per KV head
    sink_kept = [tuple(press.keep_indices(inp)[:, 0].eq(0).tolist()) for _ in range(30)]
    assert len(set(sink_kept)) > 1 and 0 < sum(map(sum, sink_kept)) < 90


def test_h2o_mean_normalisation_divides_by_the_queries_that_see_each_key():
    T = 6
    total = torch.tensor([[6.0, 2.5, 2.0, 1.5, 1.0, 0.5]])  # attention sums of one head; key j seen by T - j
    inp = PressInput(torch.zeros(1, T, 4), torch.zeros(1, T, 4), attention_sum=total)
    raw = H2OPress(0.5, normalization="sum").score(inp)
    mean = H2OPress(0.5, normalization="mean").score(inp)
    assert torch.equal(raw, total)
    assert torch.allclose(mean, torch.tensor([[1.0, 0.5, 0.5, 0.5, 0.5, 0.5]]))
    # keep 3 with no recent window: the raw sum keeps the three earliest keys, the mean keeps key 0 and ties
    assert H2OPress(0.5, recent_fraction=0.0).keep_indices(inp).tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="normalization must be one of"):
        H2OPress(0.5, normalization="max")


def test_h2o_scores_of_uniform_causal_attention_worked_by_hand():
    """Zero keys: query i spreads 1 / (i + 1) over keys 0..i. T = 4: the raw column sums are
    25/12, 13/12, 7/12, 3/12; divided by the 4, 3, 2, 1 queries that see each key: 25/48, 13/36, 7/24, 1/4."""
    keys, queries = torch.zeros(1, 4, 4), torch.zeros(1, 4, 4)
    inp = PressInput(keys, keys.clone(), queries)
    raw = H2OPress(0.5).score(inp)[0]
    mean = H2OPress(0.5, normalization="mean").score(inp)[0]
    assert torch.allclose(raw, torch.tensor([25 / 12, 13 / 12, 7 / 12, 3 / 12]))
    assert torch.allclose(mean, torch.tensor([25 / 48, 13 / 36, 7 / 24, 1 / 4]))
    assert raw[0] / raw[-1] > 8 and mean[0] / mean[-1] < 2.1, "the mean shrinks the early-key advantage"


def test_forced_press_keeps_the_forced_tokens_at_the_same_budget():
    T, d = 32, 8
    keys = torch.zeros(2, T, d)
    keys[:, 5, 0] = 10.0  # the window attends to token 5 only
    queries = torch.zeros(6, 4, d)
    queries[:, :, 0] = 1.0
    snap = SnapKVPress(0.75, window_size=4, kernel_size=1)
    inp = PressInput(keys, torch.zeros(2, T, d), queries)
    plain = snap.keep_indices(inp)
    forced = ForcedPress(snap, [12, 13, 14]).keep_indices(inp)
    assert forced.shape == plain.shape == (2, 8), "the budget does not change"
    for head in forced.tolist():
        assert {5, 12, 13, 14, 28, 29, 30, 31} == set(head), "forced tokens, the top-scored one, the window"
    with pytest.raises(ValueError, match="forced tokens and the protected ones need"):
        ForcedPress(snap, range(10)).keep_indices(inp)
    with pytest.raises(ValueError, match="outside the 32-token prompt"):
        ForcedPress(snap, [40]).keep_indices(inp)


def test_transplant_keeps_the_positions_where_the_donor_keeps_them_per_head():
    gen = torch.Generator().manual_seed(0)
    keys = torch.randn(3, 60, 8, generator=gen)
    inp = PressInput(keys, keys.clone())
    needle = list(range(20, 35))
    donor = KnormPress(0.6)
    donor_keep = donor.keep_indices(inp)
    press = ForcedPress(RandomPress(0.6, seed=1), needle, donor=donor)
    keep = press.keep_indices(inp)
    assert keep.shape == donor_keep.shape
    for h in range(3):
        ours, theirs = set(keep[h].tolist()), set(donor_keep[h].tolist())
        assert ours & set(needle) == theirs & set(needle), (
            f"head {h}: the donor's needle tokens, no more, no less"
        )
    assert press.query_window == 0 and not press.uses_attention_sum
    snap_donor = ForcedPress(RandomPress(0.5), needle, donor=SnapKVPress(0.5, window_size=4))
    assert snap_donor.query_window == 4, "the engine must collect what the donor reads"


@settings(max_examples=30, deadline=None)
@given(T=st.integers(12, 80), ratio=st.floats(0.0, 0.8), seed=st.integers(0, 5), data=st.data())
def test_contract_of_forced_presses(T, ratio, seed, data):
    name = data.draw(st.sampled_from(sorted(PRESS_CASES)))
    base = make_press(name, ratio, **PRESS_CASES[name])
    start = data.draw(st.integers(0, T - 3))
    positions = set(range(start, start + 2))
    donor = data.draw(st.sampled_from([None, KnormPress(ratio), StreamingLLMPress(ratio)]))
    press = ForcedPress(base, positions, donor)
    inp = _inputs(press, T, seed=seed)
    kept = base.num_kept(T)
    if donor is None and kept < T and 2 + int(base.protected(T, kept).sum()) > kept:
        with pytest.raises(ValueError, match="forced tokens"):
            press.keep_indices(inp)
        return
    keep = press.keep_indices(inp)
    assert keep.shape == (2, kept)
    for head in keep:
        assert torch.all(head[1:] > head[:-1])
        if donor is None:
            assert positions <= set(head.tolist())


def test_a_transplant_onto_a_sink_keeping_random_press_keeps_both():
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(3, 80, 8, generator=gen)
    inp = PressInput(keys, keys.clone())
    needle, donor = list(range(30, 50)), KnormPress(0.7)
    press = ForcedPress(ForcedPress(RandomPress(0.7, seed=5), [0]), needle, donor=donor)
    keep, donor_keep = press.keep_indices(inp), donor.keep_indices(inp)
    for h in range(3):
        assert 0 in keep[h].tolist(), "the sink is kept in every head"
        assert set(keep[h].tolist()) & set(needle) == set(donor_keep[h].tolist()) & set(needle)
