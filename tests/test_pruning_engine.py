"""KV pruning inside the engine (longctx.engine.pruning): the press really frees blocks, compacts the right
tokens, keeps positions, works with chunked prefill and preemption, and changes nothing at ratio 0.

All on a tiny random-weight Llama (fast); the real model's costs are measured in benchmarks/."""

from __future__ import annotations

import pytest
import torch

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.block_manager import BlockManager, blocks_for_tokens
from longctx.kv.press import PRESSES, make_press
from longctx.model.llama import Llama
from longctx.specs import ModelSpec

SPEC = ModelSpec(
    name="tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, source="test",
    intermediate_size=48, vocab_size=50, rope_theta=10000.0, max_context=512,
)
OPTIONS = {"streaming_llm": {}, "snapkv": {"window_size": 8}, "h2o": {}, "random": {"seed": 1}, "knorm": {}}
BS = 4


@pytest.fixture(scope="module")
def model():
    return Llama(SPEC).init_random_(seed=3, std=0.3).eval()


def _prompt(n, seed=0):
    return torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model, press=None, num_blocks=128, scheduler=None):
    executor = TorchExecutor(model, BlockManager(num_blocks, BS), press=press)
    return Engine(executor, scheduler or MonolithicScheduler(), max_model_len=512)


def _run(model, prompts, max_tokens, press=None, **kw):
    engine = _engine(model, press, **kw)
    seqs = [engine.add_request(p, max_tokens, arrival_s=0.0) for p in prompts]
    engine.run_until_done()
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks, "blocks leaked"
    return engine, seqs


def test_every_press_is_tested_in_the_engine():
    assert set(OPTIONS) == set(PRESSES)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_ratio_zero_changes_no_token(model, name):
    prompts = [_prompt(40, 1), _prompt(23, 2)]
    _, plain = _run(model, prompts, 30)
    _, pressed = _run(model, prompts, 30, make_press(name, 0.0, **OPTIONS[name]))
    assert [s.output_token_ids for s in pressed] == [s.output_token_ids for s in plain]
    assert all(s.num_evicted_tokens == 0 for s in pressed)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_pruned_prefill_frees_blocks_and_decoding_goes_on(model, name):
    press = make_press(name, 0.75, **OPTIONS[name])
    engine = _engine(model, press)
    seq = engine.add_request(_prompt(64), 10)
    engine.step()  # the whole prompt in one step, then the press
    kept = press.num_kept(64)
    assert seq.num_evicted_tokens == 64 - kept and seq.num_cached_tokens == kept
    assert len(engine.block_manager.block_table(seq.seq_id)) == blocks_for_tokens(kept, BS)
    engine.block_manager.check_invariants()
    engine.run_until_done()
    assert len(seq.output_token_ids) == 10 and seq.num_computed_tokens == 64 + 9
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_compaction_keeps_exactly_the_chosen_tokens_and_their_positions(model):
    """StreamingLLM keeps the same tokens in every head: compare the compacted cache with an unpruned one."""
    prompt = _prompt(48, 5)
    full = _engine(model)
    pruned = _engine(model, make_press("streaming_llm", 0.5))  # keep 24: 4 sinks + the last 20
    a, b = full.add_request(prompt, 3), pruned.add_request(prompt, 3)
    full.step(), pruned.step()
    keep = list(range(4)) + list(range(28, 48))
    fa, fb = full.executor, pruned.executor
    for layer in range(SPEC.num_layers):
        ka, kb = fa.cache.flat(layer)[0], fb.cache.flat(layer)[0]
        slots_a = [fa.block_manager.block_table(a.seq_id)[p // BS] * BS + p % BS for p in keep]
        slots_b = [fb.block_manager.block_table(b.seq_id)[j // BS] * BS + j % BS for j in range(24)]
        assert torch.equal(kb[slots_b], ka[slots_a])
    full.step(), pruned.step()  # the first output token is decoded at position 48 in both
    assert a.output_token_ids[0] == b.output_token_ids[0]
    # layer 0 keys depend on the token and its position only
    k0a, k0b = fa.cache.flat(0)[0], fb.cache.flat(0)[0]
    slot_a = fa.block_manager.block_table(a.seq_id)[48 // BS] * BS + 48 % BS
    slot_b = fb.block_manager.block_table(b.seq_id)[24 // BS] * BS + 24 % BS
    torch.testing.assert_close(k0b[slot_b], k0a[slot_a])


@pytest.mark.parametrize("name", ["snapkv", "h2o", "knorm"])
def test_chunked_prefill_prunes_like_one_prefill(model, name):
    """SnapKV's window spans chunks, H2O's attention sum is accumulated chunk by chunk: same tokens kept."""
    prompts = [_prompt(61, 7), _prompt(37, 8), _prompt(33, 9)]  # 33 alone would end in a 1-token chunk
    press = make_press(name, 0.6, **OPTIONS[name])
    _, whole = _run(model, prompts, 12, press)
    _, chunked = _run(model, prompts, 12, press, scheduler=ChunkedPrefillScheduler(16))
    _, one_token_tail = _run(model, prompts[2:], 12, press, scheduler=ChunkedPrefillScheduler(16))
    assert one_token_tail[0].output_token_ids == whole[2].output_token_ids
    assert [s.output_token_ids for s in chunked] == [s.output_token_ids for s in whole]
    assert [s.num_evicted_tokens for s in chunked] == [s.num_evicted_tokens for s in whole]


def test_freed_blocks_let_another_sequence_in(model):
    """A pool that holds one 64-token request at a time holds two once the first is pruned."""
    num_blocks = blocks_for_tokens(64 + 8, BS) + 4

    def first_token_of_b(press):
        engine = _engine(model, press, num_blocks=num_blocks, scheduler=ChunkedPrefillScheduler(64))
        a = engine.add_request(_prompt(64, 1), 8, arrival_s=0.0)
        b = engine.add_request(_prompt(64, 2), 8, arrival_s=0.0)
        engine.run_until_done()
        engine.block_manager.check_invariants()
        return b.token_times_s[0] < a.finished_s

    assert not first_token_of_b(None)  # without pruning b waits for a
    assert first_token_of_b(make_press("knorm", 0.75))


def test_rolling_streaming_llm_keeps_its_budget_during_decode(model):
    press = make_press("streaming_llm", 0.5)
    engine = _engine(model, press)
    seq = engine.add_request(_prompt(32), 60)
    held = []
    while engine.has_unfinished():
        engine.step()
        if not seq.is_finished:
            held.append(seq.num_cached_tokens)
            assert len(engine.block_manager.block_table(seq.seq_id)) <= blocks_for_tokens(16 + BS, BS) + 1
    assert max(held) < 16 + BS and seq.num_evicted_tokens > 16, "the window rolled during decode"
    assert len(seq.output_token_ids) == 60


def test_preempted_sequence_is_pruned_again_after_recompute(model):
    press = make_press("knorm", 0.5)
    engine = _engine(model, press, num_blocks=blocks_for_tokens(40 + 30, BS) + 2,
                     scheduler=ChunkedPrefillScheduler(32))
    seqs = [engine.add_request(_prompt(40, i), 30, arrival_s=0.0) for i in range(3)]
    engine.run_until_done()
    engine.block_manager.check_invariants()
    assert all(len(s.output_token_ids) == 30 for s in seqs)


def test_bad_press_input_gets_a_clear_error(model):
    engine = _engine(model, make_press("snapkv", 0.5, window_size=32))
    with pytest.raises(ValueError, match="window .32 tokens. is larger than the prompt .10 tokens."):
        engine.add_request(_prompt(10), 5)
    with pytest.raises(ValueError, match="press must be a longctx.kv.press.Press"):
        TorchExecutor(model, BlockManager(8, BS), press="snapkv")


def test_continuation_nll_without_press_matches_token_nll_and_pruning_changes_it(model):
    from longctx.evals.forcing import continuation_nll
    from longctx.evals.perplexity import token_nll

    ids = _prompt(90, 4)
    full = token_nll(model, ids, chunk_size=32)
    assert continuation_nll(model, ids[:60], ids[60:]) == pytest.approx(sum(full[59:]) / 30, abs=1e-5)
    assert continuation_nll(model, ids[:60], ids[60:], make_press("knorm", 0.0)) == pytest.approx(
        sum(full[59:]) / 30, abs=1e-5)
    assert continuation_nll(model, ids[:60], ids[60:], make_press("knorm", 0.9)) != pytest.approx(
        sum(full[59:]) / 30, abs=1e-3)


@pytest.mark.slow
def test_snapkv_scores_of_the_real_model_match_transformers_attention_weights():
    """The window queries the probe collects give the same SnapKV scores as transformers' own (eager)
    attention weights of SmolLM2: an independent check of the press's inputs on the real model."""
    import torch.nn.functional as F
    from model_fixtures import hf_model, our_model, our_tokenizer

    from longctx.engine.pruning import PressRecorder
    from longctx.evals.forcing import forward_at
    from longctx.evals.haystack import HaystackBuilder
    from longctx.kv.cache import PagedKVCache
    from longctx.kv.press import per_kv_head

    hf = hf_model(attn_implementation="eager")   # transformers' GGUF reading, its eager attention
    model, tok = our_model(), our_tokenizer()
    prompt = HaystackBuilder(tok).build(256, 0.5, 0, "passkey").token_ids
    with torch.no_grad():
        attentions = hf(torch.tensor([prompt]), output_attentions=True).attentions  # per layer [1, H, T, T]
    press = make_press("snapkv", 0.5)
    recorder, cache = PressRecorder(press, model), PagedKVCache.for_model(model.config, 16, 16)
    with recorder.recording([(0, 0, True)]):
        forward_at(model, cache, list(range(16)), prompt, 0, [255])
    for layer in (0, 7, 29):
        window = attentions[layer][0, :, -32:, :].mean(1)  # [H, T]
        pooled = F.avg_pool1d(window[:, None, :], 5, stride=1, padding=2, count_include_pad=False)[:, 0]
        ours = press.score(recorder.layer_input(cache, list(range(16)), 0, 256, layer))
        torch.testing.assert_close(ours, per_kv_head(pooled, 3), atol=1e-6, rtol=1e-4)


def test_a_recording_executor_keeps_the_press_and_the_pool_of_the_executor_it_wraps(model):
    """RecordingExecutor follows the executor protocol: the engine finds the wrapped executor's pool, and the
    press still prunes (the same tokens and evictions as unwrapped)."""
    from longctx.sim.recording import RecordingExecutor

    press = make_press("snapkv", 0.5, window_size=8)
    inner = TorchExecutor(model, BlockManager(64, BS), press=press)
    rec = RecordingExecutor(inner)
    engine = Engine(rec, MonolithicScheduler(), max_model_len=512)
    assert engine.block_manager is inner.block_manager
    with pytest.raises(ValueError, match="window"):
        engine.add_request(_prompt(5), 2)  # the press's check reaches the engine through the wrapper
    seq = engine.add_request(_prompt(40, 1), 6)
    engine.run_until_done()
    _, [plain] = _run(model, [_prompt(40, 1)], 6, make_press("snapkv", 0.5, window_size=8), num_blocks=64)
    assert seq.num_evicted_tokens == plain.num_evicted_tokens == 20
    assert seq.output_token_ids == plain.output_token_ids and len(rec.steps) == 6
    assert engine.counters.num_press_evicted_tokens == 20


def test_sampling_runs_in_the_executor_seeded_per_sequence(model):
    """Temperature sampling inside TorchExecutor: a seed reproduces a sequence's tokens even when other
    sequences share its steps; temperature 0 is the greedy argmax."""
    from longctx.engine import SamplingParams

    def run(*requests):
        engine = _engine(model)
        seqs = [engine.add_request(_prompt(12, seed), 10, arrival_s=0.0, sampling=p) for seed, p in requests]
        engine.run_until_done()
        return [s.output_token_ids for s in seqs]

    hot = SamplingParams(1.5, 0.95, seed=4)
    alone = run((0, hot))[0]
    together = run((1, SamplingParams(1.5, seed=9)), (0, hot), (2, None))
    assert together[1] == alone  # its own generator: the neighbours' draws do not change it
    assert run((0, SamplingParams(1.5, 0.95, seed=5)))[0] != alone
    assert run((0, SamplingParams(0.0)))[0] == run((0, None))[0] != alone
