"""Chunked prefill is exact up to rounding, and the engine's mixed batches change no token (real model)."""

import pytest
from model_fixtures import PROMPTS, our_model, our_tokenizer

from longctx.engine import (
    ChunkedPrefillScheduler,
    Engine,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    TorchExecutor,
    chunked_prefill_max_diff,
    generate,
)
from longctx.kv.block_manager import BlockManager


@pytest.mark.slow
def test_chunked_prefill_logits_equal_monolithic_within_1e_3():
    model, tok = our_model(), our_tokenizer()
    short = tok.encode_chat(PROMPTS[1])  # ~60 tokens: chunks of 1 and 7 stay cheap
    long = tok.encode(" ".join(PROMPTS) * 7)  # ~550 tokens: 512 really chunks
    assert len(long) > 512
    diffs = chunked_prefill_max_diff(model, short, (1, 7)) | chunked_prefill_max_diff(model, long, (64, 512))
    assert set(diffs) == {1, 7, 64, 512}
    assert all(d <= 1e-3 for d in diffs.values()), diffs


@pytest.mark.slow
def test_chunked_greedy_outputs_are_identical():
    model, tok = our_model(), our_tokenizer()
    ids = tok.encode(" ".join(PROMPTS))  # ~80 tokens
    reference = generate(model, ids, 12)
    for chunk in (7, 64):
        assert generate(model, ids, 12, chunk_size=chunk) == reference


@pytest.mark.slow
def test_mixed_batches_give_each_request_its_solo_tokens():
    """Prefill chunks and decodes of several requests share forward passes; no token may change."""
    model, tok = our_model(), our_tokenizer()
    prompts = [tok.encode_chat(p) for p in PROMPTS]
    solo = [generate(model, ids, 10) for ids in prompts]
    for scheduler in (ChunkedPrefillScheduler(24), PrefillFirstChunkedScheduler(24), MonolithicScheduler()):
        bm = BlockManager(40, 16)
        engine = Engine(TorchExecutor(model, bm), scheduler)
        seqs = [engine.add_request(ids, max_tokens=10) for ids in prompts]
        engine.run_until_done()
        assert [s.output_token_ids for s in seqs] == solo
        assert bm.num_free_blocks == 40
        mixed = any(r.num_prefill_tokens and r.num_decode_tokens for r in engine.history)
        assert mixed == isinstance(scheduler, ChunkedPrefillScheduler)  # only the stall-free policy mixes


@pytest.mark.parametrize("backend", ["reference", "fused"])
@pytest.mark.parametrize("scheduler", [ChunkedPrefillScheduler(5), MonolithicScheduler()])
def test_batched_decodes_of_different_lengths_match_solo_runs_on_a_tiny_model(scheduler, backend):
    """Decode groups (several sequences, padded and masked, rows not in order) change no token; neither does
    the fused backend's paged decode (solo runs on the reference backend)."""
    import torch

    from longctx.model.llama import Llama
    from longctx.specs import ModelSpec

    spec = ModelSpec(name="tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                     source="test", intermediate_size=48, vocab_size=50, rope_theta=10000.0, max_context=128)
    model = Llama(spec).init_random_(seed=3, std=0.3).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (3, 17, 6, 40, 9)]
    solo = [generate(model, p, 12, block_size=4, attention_backend="reference") for p in prompts]
    engine = Engine(TorchExecutor(model, BlockManager(64, 4), attention_backend=backend), scheduler,
                    max_model_len=128)
    seqs = [engine.add_request(p, 12, arrival_s=0.0) for p in prompts]
    engine.run_until_done()
    assert [s.output_token_ids for s in seqs] == solo
    assert max(r.num_decode_tokens for r in engine.history) >= 3  # several decodes shared a step
