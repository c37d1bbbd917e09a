"""Many presses from one prefill (longctx.evals.pruned) give what NiahRunner gives press by press, and the
retention picture says which needle tokens each layer's KV heads kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_fixtures import our_tokenizer

from longctx.evals.niah import NiahRunner
from longctx.evals.pruned import PrefillSnapshot, PrunedScorer, needle_retention
from longctx.kv.intervention import ForcedPress
from longctx.kv.press import make_press
from longctx.model.llama import Llama
from longctx.specs import ModelSpec


@pytest.fixture(scope="module")
def tiny():
    """A random-weight Llama with SmolLM2's vocabulary, so real needle prompts run through it in
    milliseconds."""
    vocab = our_tokenizer().vocab_size
    spec = ModelSpec(
        name="tiny-vocab", num_layers=3, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, source="test",
        intermediate_size=48, vocab_size=vocab, rope_theta=10000.0, max_context=1024,
    )
    return Llama(spec).init_random_(seed=5, std=0.4).eval()


def _configs(prompt):
    needle = range(prompt.needle_start, prompt.needle_start + prompt.needle_len)
    return [
        (lambda: None, True),
        (lambda: make_press("snapkv", 0.5), True),
        (lambda: make_press("snapkv", 0.5), False),
        (lambda: make_press("h2o", 0.6, normalization="mean"), True),
        (lambda: make_press("random", 0.7, seed=4), True),
        (lambda: make_press("knorm", 0.25), False),
        (lambda: ForcedPress(make_press("snapkv", 0.6), needle), True),
        (
            lambda: ForcedPress(make_press("random", 0.6, seed=2), needle, donor=make_press("snapkv", 0.6)),
            True,
        ),
    ]


def test_one_prefill_serves_every_press_as_niah_runner_does(tiny):
    tok = our_tokenizer()
    runner = NiahRunner(tiny, tok, max_tokens=400)
    prompt = runner.builder.build(160, 0.4, seed=9)
    scorer = PrunedScorer(tiny, tok, PrefillSnapshot.capture(tiny, prompt.token_ids), max_batch=4)
    configs = _configs(prompt)
    batched = scorer.answer_many(prompt, [(make(), aware) for make, aware in configs])
    assert len(batched) == len(configs)
    for (make, aware), got in zip(configs, batched, strict=True):
        want = NiahRunner(tiny, tok, max_tokens=400, press=make(), question_aware=aware).score(prompt)
        assert got.reading.answer_logprob == pytest.approx(want.answer_logprob, abs=1e-4)
        assert got.reading.output_ids == want.output_ids and got.reading.correct == want.correct
        assert np.allclose(got.reading.token_logprobs, want.token_logprobs, atol=1e-4)
    assert batched[0].kept_tokens == prompt.length and batched[2].kept_tokens < prompt.question_start


def test_snapshot_keeps_what_the_engine_recorder_would_show(tiny):
    from longctx.engine.pruning import PressRecorder
    from longctx.evals.forcing import forward_at
    from longctx.kv.cache import PagedKVCache

    tok = our_tokenizer()
    prompt = NiahRunner(tiny, tok).builder.build(200, 0.5, seed=1)
    snap = PrefillSnapshot.capture(tiny, prompt.token_ids)
    for press in (make_press("snapkv", 0.5), make_press("h2o", 0.5)):
        rec, cache = PressRecorder(press, tiny), PagedKVCache.for_model(tiny.config, 13, 16)
        with rec.recording([(0, 0, True)]):
            forward_at(tiny, cache, list(range(13)), prompt.token_ids, 0, [199])
        for layer in range(3):
            inp = rec.layer_input(cache, list(range(13)), 0, 200, layer)
            assert torch.equal(press.keep_indices(inp), snap.keep_indices(press)[layer])


def test_needle_retention_marks_each_kept_needle_token_per_layer_and_head():
    keep = [torch.tensor([[0, 5, 6, 9], [1, 2, 7, 8]]), torch.tensor([[5, 6, 7, 8], [0, 1, 2, 3]])]
    ret = needle_retention(keep, start=5, length=3)  # needle tokens 5, 6, 7
    assert ret.shape == (2, 2, 3) and ret.dtype == bool
    assert ret.tolist() == [
        [[True, True, False], [False, False, True]],
        [[True, True, True], [False, False, False]],
    ]


def test_a_prompt_the_snapshot_did_not_prefill_is_refused(tiny):
    tok = our_tokenizer()
    builder = NiahRunner(tiny, tok).builder
    snap = PrefillSnapshot.capture(tiny, builder.build(150, 0.5, 0).token_ids)
    with pytest.raises(ValueError, match="not the one this snapshot prefilled"):
        PrunedScorer(tiny, tok, snap).answer(builder.build(150, 0.5, 1), None)
    with pytest.raises(ValueError, match="num_tokens must be in"):
        snap.press_input(0, 151, make_press("knorm", 0.5))


@pytest.mark.slow
def test_real_model_force_keep_and_transplant_run_at_one_budget():
    from model_fixtures import our_model

    model, tok = our_model(), our_tokenizer()
    runner = NiahRunner(model, tok, max_tokens=400)
    prompt = runner.builder.build(300, 0.5, seed=0)
    snap = PrefillSnapshot.capture(model, prompt.token_ids)
    needle = range(prompt.needle_start, prompt.needle_start + prompt.needle_len)
    snap_press = make_press("snapkv", 0.8)
    out = PrunedScorer(model, tok, snap).answer_many(prompt, [
        (snap_press, True), (ForcedPress(make_press("snapkv", 0.8), needle), True),
        (ForcedPress(make_press("random", 0.8, seed=0), needle, donor=make_press("snapkv", 0.8)), True)])
    plain, forced, transplant = out
    assert plain.kept_tokens == forced.kept_tokens == transplant.kept_tokens == 300 - 240
    assert needle_retention(forced.keep, prompt.needle_start, prompt.needle_len).all()
    same = needle_retention(plain.keep, prompt.needle_start, prompt.needle_len)
    assert np.array_equal(needle_retention(transplant.keep, prompt.needle_start, prompt.needle_len), same)
    want = NiahRunner(model, tok, max_tokens=400, press=make_press("snapkv", 0.8)).score(prompt)
    assert plain.reading.answer_logprob == pytest.approx(want.answer_logprob, abs=2e-3)
    assert plain.reading.correct == want.correct


def test_continuation_nll_from_one_prefill_matches_pruning_each_time(tiny):
    from longctx.evals.forcing import continuation_nll
    from longctx.evals.pruned import continuation_nll_many

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 5000, (150,), generator=gen).tolist()
    ctx, cont = ids[:120], ids[120:]
    presses = [
        None, make_press("snapkv", 0.5, window_size=8), make_press("h2o", 0.5),
        make_press("random", 0.5, seed=1),
    ]
    got = continuation_nll_many(tiny, PrefillSnapshot.capture(tiny, ctx), presses, cont)
    fresh = [
        None, make_press("snapkv", 0.5, window_size=8), make_press("h2o", 0.5),
        make_press("random", 0.5, seed=1),
    ]
    want = [continuation_nll(tiny, ctx, cont, p) for p in fresh]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 4) for x in got)) == 4, "every press changes the continuation's NLL"
