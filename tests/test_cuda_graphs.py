"""Decode CUDA graphs without the capture: bucket choice, padding to a scratch slot, buffers refilled in
place, and a step run eagerly through those buffers giving the normal path's logits and tokens (the CPU
stands in for the replay; only ``torch.cuda.graph`` itself needs a GPU)."""

import random

import pytest
import torch

from longctx.engine import ChunkedPrefillScheduler, Engine, TorchExecutor
from longctx.engine.cuda_graphs import (
    SCRATCH_SEQ_ID,
    DecodeGraphs,
    attach_decode_graphs,
    graph_buckets,
    pad_decode_step,
)
from longctx.kv.block_manager import BlockManager
from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata
from longctx.model.attention import choose_backend
from longctx.model.llama import Llama
from longctx.specs import ModelSpec

SPEC = ModelSpec(name="tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                 source="test", intermediate_size=48, vocab_size=50, rope_theta=10000.0, max_context=256)
FUSED = choose_backend("fused", "cpu", torch.float32).backend


def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert graph_buckets(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert graph_buckets(5) == (1, 2, 4, 8) and graph_buckets(1) == (1,)
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        graph_buckets(0)


def test_padded_rows_write_and_read_the_scratch_slot_only():
    chunks = [ChunkSlots([7, 3], 5, 1), ChunkSlots([2], 0, 1), ChunkSlots([4, 9, 1], 8, 1, first_position=12)]
    step = pad_decode_step([11, 12, 13], chunks, bucket=4, block_size=4, scratch_block=6)
    assert step.input_ids == [11, 12, 13, 0] and step.positions == [5, 0, 12, 0]
    # position 5 of table [7, 3] is slot 3 * 4 + 1; position 8 of [4, 9, 1] is block 1's first slot
    assert step.slot_mapping == [13, 8, 4, 24]
    assert step.decodes == [(0, [7, 3], 6), (1, [2], 1), (2, [4, 9, 1], 9), (3, [6], 1)]
    with pytest.raises(ValueError, match="row 0 has 3 new tokens"):
        pad_decode_step([1], [ChunkSlots([0], 0, 3)], 1, 4, 6)
    with pytest.raises(ValueError, match="B <= bucket"):
        pad_decode_step([1, 2], chunks[:2], 1, 4, 6)


def _scattered(seed, lens, block_size, bm):
    """Sequences of ``lens`` tokens cached in shuffled blocks taken from ``bm``; their decode chunks."""
    chunks = []
    for i, n in enumerate(lens):
        bm.allocate(i, n + 1)
        chunks.append(ChunkSlots(bm.block_table(i), n, 1))
    return chunks


@pytest.mark.parametrize("seed", [0, 1])
def test_a_step_through_the_graph_buffers_gives_the_normal_logits(seed):
    bs, num_blocks = 4, 40
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=seed, std=0.3).eval()
    bm = BlockManager(num_blocks, bs)
    rng = random.Random(seed)
    bm._free = rng.sample(bm._free, len(bm._free))  # scattered tables
    cache = PagedKVCache.for_pool(SPEC, bm)
    cache.data.normal_(generator=torch.Generator().manual_seed(seed))
    graphs = DecodeGraphs(model, cache, bm, FUSED, max_batch=8, capture=False)
    assert bm.block_table(SCRATCH_SEQ_ID) == [graphs.scratch_block]
    chunks = _scattered(seed, [9, 3, 16, 22, 5], bs, bm)  # 5 decodes: bucket 8, 3 padded rows
    ids = [rng.randrange(SPEC.vocab_size) for _ in chunks]
    before = cache.data.clone()
    with torch.inference_mode():
        normal = model(torch.tensor(ids), cache, build_attention_metadata(chunks, bs, decode_groups=False),
                       backend=FUSED)
        ref = model(torch.tensor(ids), cache, build_attention_metadata(chunks, bs),
                    backend=choose_backend("reference", "cpu", torch.float32).backend)
        after_normal = cache.data.clone()
        padded = graphs.run(ids, chunks)
    assert padded.shape == (5, SPEC.vocab_size)
    torch.testing.assert_close(padded, normal, atol=2e-5, rtol=0)
    torch.testing.assert_close(padded, ref, atol=2e-5, rtol=0)
    # the padded rows wrote the scratch slot only: every other slot is as the normal step left it
    flat = lambda t: t.flatten(2, 3)  # noqa: E731  [L, 2, slots, H_kv, d]
    scratch = graphs.scratch_block * bs
    moved = ~torch.isclose(flat(cache.data), flat(after_normal), atol=1e-5, rtol=0)  # rounding aside
    assert moved.flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist() == [scratch]
    assert (flat(after_normal) != flat(before)).flatten(3).any(-1).any(0).any(0).sum() == len(chunks)
    assert graphs.stats.replayed == 1 and graphs.describe()["ran"] == "eager-buffers"
    graphs.warm([8, 3, 1])  # buckets 8, 4 and 1 from padded rows alone: the scratch slot, nothing else
    assert sorted(graphs._buckets) == [1, 4, 8] and graphs._buckets[1].tokens[2].tolist() == [scratch]
    moved = ~torch.isclose(flat(cache.data), flat(after_normal), atol=1e-5, rtol=0)
    assert moved.flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist() == [scratch]


def test_the_buffers_are_refilled_in_place_and_the_table_padded_to_its_fixed_width():
    bs = 4
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=0).eval()
    bm = BlockManager(30, bs)
    cache = PagedKVCache.for_pool(SPEC, bm)
    graphs = DecodeGraphs(model, cache, bm, FUSED, max_batch=4, max_blocks=8, capture=False)
    long_chunks = _scattered(0, [20, 7, 2], bs, bm)
    with torch.inference_mode():
        graphs.run([1, 2, 3], long_chunks)
        bucket = graphs._buckets[4]
        addresses = [t.data_ptr() for t in (bucket.tokens, bucket.full_kv_indices, bucket.kv_num_blocks)]
        assert bucket.full_kv_indices.shape == (4, 1, 1, 8)
        first = bucket.full_kv_indices[0].flatten().tolist()
        assert first[:6] == bm.block_table(0) and first[6:] == [0, 0]  # 20 cached + 1 new: 6 blocks
        for i in range(3):
            bm.free(i)
        short = _scattered(1, [1, 1, 1], bs, bm)  # three again (bucket 4), each in one block
        graphs.run([4, 5, 6], short)
    assert [t.data_ptr() for t in (bucket.tokens, bucket.full_kv_indices, bucket.kv_num_blocks)] == addresses
    assert bucket.tokens[0].tolist() == [4, 5, 6, 0]  # three real rows, one padded
    # 2 keys: one partly filled block, no full one; nothing of the longer step is left past this width
    assert bucket.full_kv_num_blocks[0].item() == 0 and bucket.kv_indices[0].item() == bm.block_table(0)[0]
    assert bucket.full_kv_indices[0].flatten().tolist()[2:] == [0] * 6
    assert bucket.kv_indices[3].flatten().tolist() == [graphs.scratch_block]


def test_steps_that_do_not_fit_a_graph_run_eagerly_and_say_why():
    bs = 4
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=0).eval()
    bm = BlockManager(40, bs)
    cache = PagedKVCache.for_pool(SPEC, bm)
    graphs = DecodeGraphs(model, cache, bm, FUSED, max_batch=2, max_blocks=3, capture=False)
    assert graphs.run([1], [ChunkSlots([0, 1], 0, 5)]) is None  # a prefill chunk
    assert graphs.run([1, 2, 3], _scattered(0, [1, 1, 1], bs, bm)) is None  # 3 > bucket 2
    assert graphs.run([1], [ChunkSlots(bm.block_table(0), 12, 1)]) is None  # 4 blocks > 3
    model.layers[1].attn.probe = lambda *a: None
    assert graphs.run([1], [ChunkSlots(bm.block_table(0), 1, 1)]) is None
    assert graphs.stats.eager == {"not decode-only": 1, "over 2 decodes": 1, "a block table over 3 blocks": 1,
                                  "a probe is installed": 1}
    assert graphs.stats.replayed == 0


def _engine_tokens(graphs: str | None):
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=5, std=0.3).eval()
    executor = TorchExecutor(model, BlockManager(60, 4), attention_backend="fused")
    decided = attach_decode_graphs(executor, "auto", max_batch=4, capture=False) if graphs else None
    engine = Engine(executor, ChunkedPrefillScheduler(token_budget=12), max_model_len=64, eos_token_id=-1)
    g = torch.Generator().manual_seed(2)
    reqs = [engine.add_request(torch.randint(0, 50, (n,), generator=g).tolist(), 9)
            for n in (5, 14, 3, 8, 11)]
    engine.run_until_done()
    return [r.output_token_ids for r in reqs], executor, decided


def test_engine_tokens_are_unchanged_with_decode_graph_buffers():
    plain, _, _ = _engine_tokens(None)
    graphed, executor, decided = _engine_tokens("auto")
    assert decided == "eager-buffers" and graphed == plain
    stats = executor.decode_graphs.stats
    assert stats.replayed > 0 and stats.eager.get("not decode-only", 0) > 0
    assert set(stats.eager) <= {"not decode-only", "over 4 decodes"}


def test_attach_refuses_what_graphs_cannot_serve():
    model = Llama(SPEC).init_random_(seed=0).eval()
    executor = TorchExecutor(model, BlockManager(20, 4), attention_backend="fused")
    assert attach_decode_graphs(executor, "auto") == "off: not on CUDA" and executor.decode_graphs is None
    assert attach_decode_graphs(executor, "off") == "off: asked for"
    ref = TorchExecutor(model, BlockManager(20, 4), attention_backend="reference")
    assert attach_decode_graphs(ref, "auto", capture=False).startswith("off: the reference backend")
    with pytest.raises(ValueError, match="cuda graphs must be one of auto, off; got 'on'"):
        attach_decode_graphs(executor, "on")
    with pytest.raises(ValueError, match="need a CUDA device"):
        DecodeGraphs(model, executor.cache, executor.block_manager, FUSED, capture=True)


def test_a_failed_capture_is_one_line_and_the_steps_run_eagerly():
    plain, _, _ = _engine_tokens(None)
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=5, std=0.3).eval()
    executor = TorchExecutor(model, BlockManager(60, 4), attention_backend="fused")
    attach_decode_graphs(executor, "auto", max_batch=4, capture=False)
    executor.decode_graphs.capture = True  # a CPU has no CUDA stream: the capture fails as a broken one would
    engine = Engine(executor, ChunkedPrefillScheduler(token_budget=12), max_model_len=64, eos_token_id=-1)
    g = torch.Generator().manual_seed(2)
    reqs = [engine.add_request(torch.randint(0, 50, (n,), generator=g).tolist(), 9)
            for n in (5, 14, 3, 8, 11)]
    engine.run_until_done()
    graphs = executor.decode_graphs
    assert [r.output_token_ids for r in reqs] == plain  # every step ran eagerly instead
    assert graphs.failure.startswith("capture of bucket ") and "\n" not in graphs.failure
    assert graphs.stats.eager["capture failed"] == 1
    assert graphs.stats.eager["graphs off after a failed capture"] > 0
    assert graphs.stats.replayed == 0 and graphs.describe()["ran"] == "off"
