"""Prefix caching (longctx.kv.block_manager with enable_prefix_caching): full blocks named by a chained hash,
reference counts, an LRU list of evictable cached blocks, and the scheduler counting a hit as computed.

What it protects: no block is lost or double-counted under random arrivals, preemption and frees
(hypothesis); every key a sequence reads is its own, and a computed shared block is never written again; a
hit skips its prefill and gives the same greedy tokens; a block is shared from the step that fills it, so
requests that arrive together share their common prefix (as vLLM does)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, Scheduler
from longctx.engine.clock import VirtualClock
from longctx.engine.executor import ExecutionResult, Executor
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.block_manager import BlockManager, block_hash
from longctx.kv.press import make_press
from longctx.model.llama import Llama
from longctx.specs import ModelSpec

SPEC = ModelSpec(
    name="tiny", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, source="test",
    intermediate_size=48, vocab_size=50, rope_theta=10000.0, max_context=512,
)


def test_a_blocks_hash_depends_on_every_token_before_it():
    a = block_hash(None, [1, 2, 3, 4])
    assert a == block_hash(None, [1, 2, 3, 4])
    assert block_hash(a, [5, 6, 7, 8]) != block_hash(block_hash(None, [9, 2, 3, 4]), [5, 6, 7, 8])
    assert block_hash(None, [1, 2, 3, 4]) != block_hash(None, [1, 2, 3, 5])


def _fill(bm, sid, ids):
    bm.allocate(sid, len(ids))
    bm.cache_full_blocks(sid, lambda a, b: ids[a:b], len(ids))


def test_full_blocks_are_shared_and_the_last_token_is_always_computed():
    bm = BlockManager(10, 4, enable_prefix_caching=True)
    prefix = list(range(100, 110))  # 2 full blocks + 2 tokens
    _fill(bm, 0, prefix + [1, 2])  # 3 full blocks
    hit = bm.cached_prefix(prefix + [7, 7, 7])
    assert hit.blocks == bm.block_table(0)[:2] and hit.num_tokens == 8  # only the full blocks of the prefix
    assert bm.cached_prefix(prefix[:8]).num_tokens == 4  # 8 tokens = 2 full blocks, but 1 token must run
    assert bm.cached_prefix([0] + prefix) is None  # a different first token: a different chain
    bm.take_prefix(1, hit)
    assert [bm.ref_count(b) for b in bm.block_table(1)] == [2, 2]
    bm.allocate(1, 13)
    assert bm.block_table(1)[:2] == bm.block_table(0)[:2] and bm.num_used_blocks == 3 + 2
    bm.check_invariants()


def test_freed_cached_blocks_stay_reusable_until_evicted_least_recently_freed_first():
    bm = BlockManager(4, 2, enable_prefix_caching=True)
    _fill(bm, 0, [1, 2, 3, 4])  # blocks A, B cached
    _fill(bm, 1, [5, 6, 7, 8])  # blocks C, D cached
    bm.free(0)
    bm.free(1)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 4  # free, and still cached
    assert bm.cached_prefix([1, 2, 3, 4, 9]).num_tokens == 4
    bm.allocate(2, 2)  # no blank block left: evicts the least recently freed, seq 0's tail block first
    assert bm.num_evictions == 1
    assert bm.cached_prefix([1, 2, 3, 4, 9]).num_tokens == 2  # its first block survived
    assert bm.cached_prefix([5, 6, 7, 8, 9]).num_tokens == 4
    bm.check_invariants()


def test_shrink_and_a_press_refuse_prefix_caching():
    bm = BlockManager(4, 2, enable_prefix_caching=True)
    bm.allocate(0, 4)
    with pytest.raises(ValueError, match="prefix caching"):
        bm.shrink(0, 2)
    model = Llama(SPEC).init_random_(seed=3)
    with pytest.raises(ValueError, match="use a press or prefix caching"):
        TorchExecutor(model, BlockManager(8, 4, enable_prefix_caching=True), press=make_press("knorm", 0.5))


class CheckingExecutor(Executor):
    """Checks, every step, what a real attention would read and write, with a shadow of the pool (slot ->
    (token, position)): it writes the step's new tokens first, then checks that every position each entry
    attends to holds that sequence's own token, as the model does layer by layer (all K/V of the step are
    written before any attention reads). A block shared in the same step it is filled is read correctly only
    because of that order. No entry overwrites a slot that another sequence still holding the block wrote
    (a computed shared block is never written again). Returns a token that depends only on the sequence's
    tokens (so sharing a cached prefix cannot change the outputs)."""

    def __init__(self, bm):
        self.bm = bm
        self.shadow: dict[int, tuple[int, int]] = {}  # slot -> (token id, position) last written there
        self.writer: dict[int, int] = {}  # slot -> seq id that wrote it last

    def _slot(self, table, p):
        bs = self.bm.block_size
        return table[p // bs] * bs + p % bs

    def execute(self, batch):
        tokens, bs = [], self.bm.block_size
        for seq, n in batch.entries:  # 1) every new token's K/V goes to its slot
            table, first = self.bm.block_table(seq.seq_id), seq.num_computed_tokens
            ids = seq.token_ids(0, first + n)
            for p in range(first, first + n):
                slot, owner = self._slot(table, p), self.writer.get(self._slot(table, p))
                if owner is not None and owner != seq.seq_id:
                    assert table[p // bs] not in self.bm.block_table(owner), (
                        f"seq {seq.seq_id} overwrites block {table[p // bs]}, computed by seq {owner} that "
                        "holds it"
                    )
                self.shadow[slot], self.writer[slot] = (ids[p], p), seq.seq_id
        for seq, n in batch.entries:  # 2) then attention reads every position of the sequence
            table, ids = self.bm.block_table(seq.seq_id), seq.token_ids(0, seq.num_computed_tokens + n)
            for p, token in enumerate(ids):
                assert self.shadow.get(self._slot(table, p)) == (token, p), (
                    f"seq {seq.seq_id} reads a wrong key at {p}"
                )
            tokens.append(sum(ids) % 7)
        return ExecutionResult(duration_s=0.001 + 1e-5 * batch.num_tokens, next_token_ids=tokens)


requests = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 30), st.integers(1, 12), st.floats(0, 0.05)), min_size=1,
    max_size=12)


@settings(max_examples=120, deadline=None)
@given(num_blocks=st.integers(12, 40), block_size=st.sampled_from([2, 4]), reqs=requests,
       chunked=st.booleans(), aborts=st.lists(st.integers(0, 11), max_size=3))
def test_random_arrivals_preemption_and_frees_never_leak_nor_write_a_shared_block(
        num_blocks, block_size, reqs, chunked, aborts):
    prefixes = [list(range(1, 20)), list(range(30, 45)), []]  # two shared system prompts, or none
    runs = {}
    for caching in (False, True):
        bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        sched = ChunkedPrefillScheduler(8) if chunked else MonolithicScheduler()
        engine = Engine(CheckingExecutor(bm), sched, bm, clock=VirtualClock())
        seqs = []
        for i, (p, tail, out, t) in enumerate(reqs):
            prompt = prefixes[p] + [100 + i] * tail
            if -(-(len(prompt) + out) // block_size) <= num_blocks:
                seqs.append(engine.add_request(prompt, out, arrival_s=t))
        steps = 0
        while engine.has_unfinished():
            engine.step()
            bm.check_invariants()
            if steps in aborts and engine.running:
                engine.abort(engine.running[-1].seq_id)
            steps += 1
            assert steps < 5000
        assert bm.num_used_blocks == 0 and bm.num_free_blocks == num_blocks
        runs[caching] = {s.seq_id: s.output_token_ids for s in seqs if s.finish_reason != "abort"}
    if not aborts:  # the same requests give the same tokens with and without the cache
        assert runs[True] == runs[False]


def test_a_hit_skips_the_prefill_of_the_shared_blocks():
    bm = BlockManager(64, 4, enable_prefix_caching=True)
    engine = Engine(CheckingExecutor(bm), MonolithicScheduler(), bm, clock=VirtualClock())
    system = list(range(1, 42))  # 41 tokens: 10 full blocks
    first = engine.add_request(system + [7, 8], 2)
    engine.run_until_done()
    second = engine.add_request(system + [9], 2)
    record = engine.step()
    assert first.num_prefix_cached_tokens == 0 and second.num_prefix_cached_tokens == 40
    assert record.num_prefill_tokens == 42 - 40  # only the unshared tail runs


@pytest.fixture(scope="module")
def tiny():
    return Llama(SPEC).init_random_(seed=3, std=0.3).eval()


@pytest.mark.parametrize("kv_dtype", [None, "fp8"])
def test_real_attention_over_shared_blocks_gives_identical_greedy_tokens(tiny, kv_dtype):
    """Exact with the model's own dtype. Over a quantized pool a hit reads the prefix's keys back quantized
    where a fresh prefill's last chunk would attend to some of them unquantized, so only the hits and the
    lengths are checked there."""
    system = torch.randint(0, 50, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    prompts = [system + [3, 4, 5], system + [6], system + [7, 8, 9, 10, 11]]

    def run(caching):
        bm = BlockManager(96, 4, enable_prefix_caching=caching)
        engine = Engine(
            TorchExecutor(tiny, bm, kv_dtype=kv_dtype), ChunkedPrefillScheduler(16), max_model_len=512
        )
        outs = []
        for p in prompts:  # one after the other: each later one finds the system prompt cached
            seq = engine.add_request(p, 6)
            engine.run_until_done()
            outs.append((seq.output_token_ids, seq.num_prefix_cached_tokens))
        bm.check_invariants()
        return outs

    without, with_cache = run(False), run(True)
    if kv_dtype is None:
        assert [o for o, _ in with_cache] == [o for o, _ in without]
    assert all(len(o) == 6 for o, _ in with_cache)
    assert [h for _, h in with_cache] == [0, 36, 36]


@pytest.mark.slow
def test_smollm2_gives_the_same_greedy_tokens_from_a_cached_system_prompt():
    """The real model: a 300-token system prompt cached by the first request; the second request computes only
    its own tokens (after 288 cached ones, 18 full blocks) and decodes exactly what it decodes without the
    cache."""
    from model_fixtures import our_model

    model = our_model()
    system = torch.randint(100, 40_000, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    prompts = [system + [500, 600, 700], system + [501, 601]]
    outs = {}
    for caching in (False, True):
        bm = BlockManager(64, 16, enable_prefix_caching=caching)
        engine = Engine(
            TorchExecutor(model, bm), ChunkedPrefillScheduler(128), vocab_size=model.config.vocab_size
        )
        outs[caching] = []
        for p in prompts:
            seq = engine.add_request(p, 8)
            first = engine.step()
            engine.run_until_done()
            outs[caching].append(
                (seq.output_token_ids, seq.num_prefix_cached_tokens, first.num_prefill_tokens)
            )
    assert [o for o, _, _ in outs[True]] == [o for o, _, _ in outs[False]]
    assert outs[True][1][1:] == (288, 302 - 288) and outs[False][1][1:] == (0, 128)


def test_requests_arriving_together_share_the_prefix_from_the_step_that_fills_it():
    """vLLM caches a block as soon as it is full, so a request later in the same batch hits it: both arrive at
    t=0 and run in one monolithic step; the second computes only what the first did not already fill."""
    bm = BlockManager(64, 4, enable_prefix_caching=True)
    engine = Engine(CheckingExecutor(bm), MonolithicScheduler(), bm, clock=VirtualClock())
    system = list(range(1, 42))  # 41 tokens: 10 full blocks
    first = engine.add_request(system + [7, 8], 2, arrival_s=0.0)
    second = engine.add_request(system + [9], 2, arrival_s=0.0)
    record = engine.step()
    assert record.seq_ids == (first.seq_id, second.seq_id)  # one step, both prefills
    assert first.num_prefix_cached_tokens == 0 and second.num_prefix_cached_tokens == 40
    assert record.num_prefill_tokens == 43 + (42 - 40)
    assert bm.block_table(second.seq_id)[:10] == bm.block_table(first.seq_id)[:10]
    assert engine.counters.prefix_cache_queries == 43 + 42 and engine.counters.prefix_cache_hits == 40
    engine.run_until_done()
    bm.check_invariants()


class EightTokensEach(Scheduler):
    """Every sequence advances by at most 8 tokens a step, oldest first."""

    def schedule(self, running, waiting, batch):
        for seq in [*running, *waiting]:
            batch.add(seq, min(8, seq.num_uncomputed_tokens))


def test_a_chunk_shares_only_the_blocks_it_fills_this_step():
    """Chunked prefill: the first request's 8-token chunk fills 2 blocks of 4, so the request added after it
    in the same step hits those 2 blocks, not the rest of the (not yet computed) system prompt."""
    bm = BlockManager(64, 4, enable_prefix_caching=True)
    engine = Engine(CheckingExecutor(bm), EightTokensEach(), bm, clock=VirtualClock())
    system = list(range(1, 42))
    first = engine.add_request(system + [7], 1, arrival_s=0.0)
    second = engine.add_request(system + [9], 1, arrival_s=0.0)
    record = engine.step()
    assert record.seq_ids == (first.seq_id, second.seq_id) and record.chunk_tokens == (8, 8)
    assert second.num_prefix_cached_tokens == 8 and second.num_computed_tokens == 16
    engine.run_until_done()
    assert first.output_token_ids and second.output_token_ids
    bm.check_invariants()


def test_real_attention_reads_a_block_filled_in_the_same_step(tiny):
    """On the model: the K/V a request shares in the step that computes them equal those of a later step."""
    system = torch.randint(0, 50, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    prompts = [system + [3, 4, 5], system + [6], system + [7, 8, 9, 10, 11]]

    def run(caching):
        bm = BlockManager(96, 4, enable_prefix_caching=caching)
        engine = Engine(TorchExecutor(tiny, bm), MonolithicScheduler(), max_model_len=512)
        seqs = [engine.add_request(p, 6, arrival_s=0.0) for p in prompts]  # together: one prefill step
        engine.run_until_done()
        bm.check_invariants()
        return [(s.output_token_ids, s.num_prefix_cached_tokens) for s in seqs]

    without, with_cache = run(False), run(True)
    assert [h for _, h in with_cache] == [0, 36, 36]
    assert [o for o, _ in with_cache] == [o for o, _ in without]
