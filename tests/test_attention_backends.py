"""The attention-backend seam: the fused backend (eager FlexAttention on a CPU) gives the reference backend's
logits on mixed steps, changes no engine token, and is chosen (or refused) by one rule with a reason."""

import random

import pytest
import torch

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, TorchExecutor, generate
from longctx.kv.block_manager import BlockManager
from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata
from longctx.model.attention import BACKEND_NAMES, choose_backend
from longctx.model.llama import Llama
from longctx.specs import ModelSpec

SPEC = ModelSpec(name="tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                 source="test", intermediate_size=48, vocab_size=50, rope_theta=10000.0, max_context=256)
ATOL = 2e-5  # fp32: the two backends sum the same products in another order


def run_steps(model, steps, num_blocks=48, block_size=4):
    """Logits of each step: ``steps`` is a list of (token ids, chunks) over one fresh pool."""
    cache = PagedKVCache.for_model(model.config, num_blocks, block_size)
    groups = model.attention_backend.backend.uses_decode_groups
    with torch.inference_mode():
        return [model(torch.tensor(ids), cache,
                      build_attention_metadata(chunks, block_size, decode_groups=groups))
                for ids, chunks in steps]


def mixed_steps(seed=0, block_size=4, num_blocks=48):
    """Scattered block tables; step 2 holds a chunk after a prefix, a decode whose context fills its last
    block exactly, and a fresh prompt; D shares A's first two blocks (a cached prefix) and adds a chunk after
    them; step 4 decodes four unequal contexts beside a fresh prompt."""
    rng = random.Random(seed)
    blocks = list(range(num_blocks))
    rng.shuffle(blocks)
    a, b, c = blocks[:10], blocks[10:16], blocks[16:22]
    d = a[:2] + blocks[22:26]  # shares A's first 8 slots
    ids = lambda n: [rng.randrange(SPEC.vocab_size) for _ in range(n)]  # noqa: E731
    return [
        (ids(11 + 7), [ChunkSlots(a, 0, 11), ChunkSlots(b, 0, 7)]),
        (ids(13 + 1 + 5), [ChunkSlots(a, 11, 13), ChunkSlots(b, 7, 1), ChunkSlots(c, 0, 5)]),
        (ids(4), [ChunkSlots(d, 8, 4)]),  # D's own tokens after the shared prefix (a chunk after a prefix)
        (ids(4 + 6), [ChunkSlots(a, 24, 1), ChunkSlots(b, 8, 1), ChunkSlots(c, 5, 1), ChunkSlots(d, 12, 1),
                      ChunkSlots(blocks[26:30], 0, 6)]),
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_gives_the_reference_logits_on_mixed_steps(seed):
    model = Llama(SPEC, attention_backend="reference").init_random_(seed=seed, std=0.3).eval()
    steps = mixed_steps(seed)
    ref = run_steps(model, steps)
    model.attention_backend = choose_backend("fused", "cpu", torch.float32)
    fused = run_steps(model, steps)
    for r, f in zip(ref, fused, strict=True):
        torch.testing.assert_close(f, r, atol=ATOL, rtol=0)


def test_the_decode_mask_says_which_row_owns_each_block():
    from longctx.model.paged_flex import DecodeMasks, paged_decodes

    masks = DecodeMasks(num_blocks=8, block_size=4, device="cpu")
    # block 5 shared; the second ends mid-block
    paged = paged_decodes([(3, [5, 2, 7], 12), (0, [5, 1], 6)], masks)
    state = masks.for_rows(2)
    assert state.rank[:2].tolist() == [[-1, -1, 1, -1, -1, 0, -1, 2], [-1, 1, -1, -1, -1, 0, -1, -1]]
    assert state.lens[:2].tolist() == [12, 6] and paged.rows.tolist() == [3, 0]
    m = paged.block_mask  # full blocks skip the mask function on a GPU; the partly filled last one does not
    assert m.full_kv_num_blocks.flatten().tolist() == [3, 1] and m.kv_num_blocks.flatten().tolist() == [0, 1]
    assert m.kv_indices[1].flatten().tolist() == [1]


@pytest.mark.parametrize("scheduler", [ChunkedPrefillScheduler(6), MonolithicScheduler()])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_engine_tokens_are_the_same_with_either_backend(scheduler, prefix_caching):
    model = Llama(SPEC).init_random_(seed=3, std=0.3).eval()
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 50, (9,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 50, (n,), generator=g).tolist() for n in (3, 17, 6, 30)]
    outputs = {}
    for backend in ("reference", "fused"):
        pool = BlockManager(64, 4, enable_prefix_caching=prefix_caching)
        executor = TorchExecutor(model, pool, attention_backend=backend)
        assert executor.attention_backend_choice.name == backend
        engine = Engine(executor, scheduler, max_model_len=256)
        seqs = [engine.add_request(p, 10, arrival_s=0.0) for p in prompts]
        engine.run_until_done()
        outputs[backend] = [s.output_token_ids for s in seqs]
        assert pool.num_free_blocks == 64 or prefix_caching  # a prefix cache keeps its blocks for reuse
        assert max(r.num_decode_tokens for r in engine.history) >= 2  # decodes shared a step
    assert outputs["fused"] == outputs["reference"]


@pytest.mark.parametrize("press_name", ["streaming_llm", "snapkv", "knorm"])
def test_a_pruned_cache_gives_the_same_tokens_with_either_backend(press_name):
    """The press scores with probes (reference attention) at the end of the prefill; the decodes after it read
    the pruned pool: with fused, in place, RoPE positions ahead of the cache slots."""
    from longctx.kv.press import PRESSES

    model = Llama(SPEC).init_random_(seed=5, std=0.3).eval()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (40, 45, 36)]
    outputs = {}
    for backend in ("reference", "fused"):
        pool = BlockManager(64, 4)
        executor = TorchExecutor(model, pool, press=PRESSES[press_name](0.5), attention_backend=backend)
        engine = Engine(executor, ChunkedPrefillScheduler(16), max_model_len=256)
        seqs = [engine.add_request(p, 8, arrival_s=0.0) for p in prompts]
        engine.run_until_done()
        outputs[backend] = [s.output_token_ids for s in seqs]
        assert all(s.num_evicted_tokens > 0 for s in seqs) and pool.num_free_blocks == 64
    assert outputs["fused"] == outputs["reference"]


def test_a_probed_layer_attends_with_the_reference_backend():
    model = Llama(SPEC, attention_backend="fused").init_random_(seed=4, std=0.3).eval()
    seen = []
    model.layers[1].attn.probe = lambda q, keys, row: seen.append((row, keys.shape[2]))
    prompt = list(range(1, 12))
    tokens = generate(model, prompt, 4, block_size=4)
    model.layers[1].attn.probe = None
    assert tokens == generate(model, prompt, 4, block_size=4, attention_backend="reference")
    assert seen[0] == (0, 11) and [n for _, n in seen[1:]] == [12, 13, 14]  # the prompt, then each decode


def test_choice_rules_and_their_errors():
    assert choose_backend("auto", "cpu", torch.float32).name == "reference"
    assert "not on CUDA" in choose_backend("auto", "cpu", torch.bfloat16).reason
    assert choose_backend("fused", "cpu", torch.float32).name == "fused"  # allowed: eager, slow
    with pytest.raises(ValueError, match="auto, reference, fused"):
        choose_backend("flash", "cpu", torch.float32)
    with pytest.raises(ValueError, match="quantized or cast.*reference"):
        choose_backend("fused", "cpu", torch.float32, pool_in_model_dtype=False)
    assert BACKEND_NAMES == ("auto", "reference", "fused")
    # on CUDA (decided from the device's type: no GPU needed to test the rule)
    assert choose_backend("auto", "cuda", torch.bfloat16, block_size=16, head_dim=64).name == "fused"
    assert choose_backend("auto", "cuda", torch.float32).name == "reference"
    with pytest.raises(ValueError, match="bf16 or fp16"):
        choose_backend("fused", "cuda", torch.float32, block_size=16, head_dim=64)
    small = choose_backend("auto", "cuda", torch.bfloat16, block_size=4, head_dim=64)
    assert small.name == "reference" and "multiple of 16" in small.reason
    with pytest.raises(ValueError, match="head_dim >= 16"):
        choose_backend("fused", "cuda", torch.bfloat16, block_size=16, head_dim=8)
    model = Llama(SPEC).init_random_(seed=0).eval()
    with pytest.raises(ValueError, match="quantized or cast"):
        TorchExecutor(model, BlockManager(8, 4), kv_dtype="fp8", attention_backend="fused")
    executor = TorchExecutor(model, BlockManager(8, 4), kv_dtype="fp8", attention_backend="auto")
    assert executor.attention_backend_choice.name == "reference"


def test_the_decode_mask_is_one_function_per_batch_bucket_over_buffers_refilled_each_step():
    """No new mask function or buffer shape per step (a compiled kernel would recompile for each)."""
    from longctx.model.paged_flex import DecodeMasks, paged_decodes

    masks = DecodeMasks(num_blocks=16, block_size=4, device="cpu")
    first = paged_decodes([(0, [3, 9], 6), (1, [2], 3)], masks)
    state = masks.for_rows(2)
    mask_mod, rank = state.mask_mod, state.rank
    five = paged_decodes([(i, [i], 1) for i in range(5)], masks)  # padded to 8 rows: its own buffers
    assert masks.for_rows(8).lens.tolist() == [1] * 5 + [0] * 3
    assert five.block_mask.kv_num_blocks.shape[0] == 8 and five.rows.tolist() == list(range(5))
    # back to two rows after a larger batch
    second = paged_decodes([(2, [7, 1, 5], 12), (0, [3, 9], 7)], masks)
    assert masks.for_rows(2) is state and state.mask_mod is mask_mod and state.rank is rank
    assert first.block_mask.mask_mod is second.block_mask.mask_mod
    assert state.rank[0, [7, 1, 5]].tolist() == [0, 1, 2] and state.lens.tolist() == [12, 7]
    # row 1 owns blocks 3 and 9 only: the last step's rows are gone
    assert state.rank[1].tolist().count(-1) == 14


def test_the_compiled_decode_call_compiles_once_per_batch_bucket(monkeypatch):
    """The CUDA path's compiled call, traced here by dynamo with a counting backend (the graph then runs
    eagerly on the CPU): batches that grow, shrink and come back, on new block tables and contexts each step,
    compile once per padded batch size and never again."""
    from torch._dynamo.testing import CompileCounter
    from torch.nn.attention.flex_attention import flex_attention

    import longctx.model.paged_flex as paged_flex

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(paged_flex, "_compiled", torch.compile(flex_attention, dynamic=True, backend=counter))
    num_blocks, bs, rng = 32, 16, random.Random(0)
    keys, values = (torch.randn(1, 2, num_blocks * bs, 16) for _ in range(2))
    masks = paged_flex.DecodeMasks(num_blocks, bs, "cpu")
    sizes = [3, 9, 3, 9, 4, 12, 3]  # buckets 4, 16, 4, 16, 4, 16, 4
    for B in sizes:
        blocks = rng.sample(range(num_blocks), 2 * B)
        lens = [rng.randrange(1, 2 * bs + 1) for _ in range(B)]
        decodes = [(b, blocks[2 * b : 2 * b + 2], lens[b]) for b in range(B)]
        paged = paged_flex.paged_decodes(decodes, masks)
        qd = torch.randn(paged_flex.batch_bucket(B), 4, 1, 16)
        paged_flex.compiled_flex(qd, keys, values, paged.block_mask)
    assert counter.frame_count == len({paged_flex.batch_bucket(B) for B in sizes}), counter.frame_count
