"""The engine loop with torch-free executors: admission errors, timestamps, preemption, no leaks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.engine import (
    ChunkedPrefillScheduler,
    Engine,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    ToyExecutor,
    VirtualClock,
    summarize,
)
from longctx.engine.batch import ScheduledBatch
from longctx.engine.executor import ExecutionResult, Executor
from longctx.kv.block_manager import BlockManager


def fake_token(seq_id: int, position: int) -> int:
    """The 'model': the token after position ``position`` depends only on the sequence and position."""
    return (seq_id * 7919 + position * 31) % 1000 + 1


class ShadowKVExecutor(Executor):
    """Checks the paged cache's bookkeeping as a real executor would use it.

    It keeps a shadow of the pool, slot -> (seq_id, position), checks that every cached position a chunk
    attends to is still where its block table says (no sequence overwrote it), writes the chunk's own
    positions, and returns deterministic tokens. Each step takes ``step_s`` + ``token_s`` per token.
    """

    def __init__(self, block_manager: BlockManager, step_s: float = 0.01, token_s: float = 0.001):
        self.bm = block_manager
        self.step_s, self.token_s = step_s, token_s
        self.shadow: dict[int, tuple[int, int]] = {}
        self.tokens_computed = 0
        self.batches: list[list[tuple[int, int, int]]] = []  # (seq_id, start, num_tokens)

    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        bs = self.bm.block_size
        written = set()
        record, next_ids = [], []
        for seq, n in batch.entries:
            start = seq.num_computed_tokens
            table = self.bm.block_table(seq.seq_id)
            assert len(table) == -(-(start + n) // bs), "the batch reserved too few or too many blocks"
            for p in range(start):
                slot = table[p // bs] * bs + p % bs
                assert self.shadow.get(slot) == (seq.seq_id, p), f"seq {seq.seq_id} lost position {p}"
            for p in range(start, start + n):
                slot = table[p // bs] * bs + p % bs
                assert slot not in written, "two tokens of one batch write the same slot"
                written.add(slot)
                self.shadow[slot] = (seq.seq_id, p)
            record.append((seq.seq_id, start, n))
            next_ids.append(fake_token(seq.seq_id, start + n - 1))
            self.tokens_computed += n
        self.batches.append(record)
        return ExecutionResult(self.step_s + self.token_s * batch.num_tokens, next_ids)


def toy_engine(scheduler=None, num_blocks=64):
    return Engine(
        ToyExecutor(), scheduler or ChunkedPrefillScheduler(32), num_blocks=num_blocks, clock=VirtualClock()
    )


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 4, "empty"), ([1] * 8193, 4, "more than max_model_len=8192"), ([1] * 10, 0, "max_tokens"),
        ([1] * 10, -3, "max_tokens"), ([1] * 2000, 100, "pool has only 64"),
    ],
)
def test_bad_requests_raise_value_error_at_admission(prompt, max_tokens, message):
    engine = toy_engine()
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, max_tokens=max_tokens)
    assert not engine.has_unfinished()


def test_token_ids_outside_the_vocabulary_are_refused():
    engine = Engine(ToyExecutor(), MonolithicScheduler(), num_blocks=8, clock=VirtualClock(), vocab_size=100)
    for bad in (100, -1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.add_request([1, bad], max_tokens=2)


def test_timestamps_and_dummy_tokens_with_a_virtual_clock():
    engine = Engine(
        ToyExecutor(step_s=0.01, prefill_token_s=0.001, decode_token_s=0.0), MonolithicScheduler(),
        num_blocks=16, clock=VirtualClock(),
    )
    seq = engine.add_request([1] * 50, max_tokens=3, arrival_s=1.0)
    done = engine.run_until_done()
    assert done == [seq] and seq.finish_reason == "length"
    assert seq.output_token_ids == [0, 0, 0]  # dummies: the toy executor makes no tokens
    # idle until 1.0, prefill 0.01 + 0.05, then two decode steps of 0.01
    assert seq.token_times_s == pytest.approx([1.06, 1.07, 1.08])
    assert seq.ttft_s == pytest.approx(0.06) and seq.itl_s == pytest.approx([0.01, 0.01])
    assert engine.block_manager.num_free_blocks == 16


def test_eos_stops_only_with_real_tokens():
    bm = BlockManager(32, 4)
    engine = Engine(ShadowKVExecutor(bm), ChunkedPrefillScheduler(16), bm, clock=VirtualClock())
    eos = fake_token(0, 9 + 2)  # the 3rd output token of sequence 0 (prompt of 10)
    seq = engine.add_request([1] * 10, max_tokens=20, eos_token_id=eos)
    engine.run_until_done()
    assert seq.finish_reason == "stop" and seq.num_output_tokens == 3


def test_chunked_prefill_does_not_stall_decodes():
    def max_itl(scheduler):
        engine = toy_engine(scheduler, num_blocks=512)
        streams = [engine.add_request([1] * 16, max_tokens=40, arrival_s=0.0) for _ in range(4)]
        engine.add_request([1] * 2000, max_tokens=2, arrival_s=0.05)
        engine.run_until_done()
        return max(g for s in streams for g in s.itl_s)

    assert max_itl(MonolithicScheduler()) > 1.0  # the whole 2000-token prefill: ~1 s
    assert max_itl(ChunkedPrefillScheduler(64)) < 0.05


workloads = st.lists(
    st.tuples(st.integers(1, 70), st.integers(1, 12), st.floats(0, 0.2)), min_size=1, max_size=10
)


@settings(max_examples=60, deadline=None)
@given(
    workload=workloads, num_blocks=st.integers(6, 24), block_size=st.sampled_from([1, 4, 16]),
    budget=st.sampled_from([None, 1, 7, 32]), prefill_first=st.booleans(),
)
def test_random_workloads_conserve_tokens_and_free_every_block(
    workload, num_blocks, block_size, budget, prefill_first
):
    bm = BlockManager(num_blocks, block_size)
    chunked = PrefillFirstChunkedScheduler if prefill_first else ChunkedPrefillScheduler
    scheduler = MonolithicScheduler() if budget is None else chunked(budget, max_num_seqs=4)
    executor = ShadowKVExecutor(bm)
    engine = Engine(executor, scheduler, bm, clock=VirtualClock())
    seqs = []
    for prompt_len, max_tokens, arrival_s in workload:
        prompt = list(range(1, prompt_len + 1))
        if -(-(prompt_len + max_tokens) // block_size) > num_blocks:
            with pytest.raises(ValueError):
                engine.add_request(prompt, max_tokens, arrival_s=arrival_s)
            continue
        seqs.append(engine.add_request(prompt, max_tokens, arrival_s=arrival_s))
    engine.run_until_done(max_steps=10_000)
    assert bm.num_free_blocks == num_blocks  # no leaks
    bm.check_invariants()
    assert sorted(s.seq_id for s in engine.finished) == [s.seq_id for s in seqs]
    recomputed = 0
    for s in seqs:
        # tokens conserved: exactly max_tokens outputs, the same ones a run without preemption makes
        n = s.num_prompt_tokens
        assert s.output_token_ids == [fake_token(s.seq_id, n - 1 + i) for i in range(s.max_tokens)]
        assert len(s.token_times_s) == s.max_tokens
        assert all(b >= a for a, b in zip(s.token_times_s, s.token_times_s[1:], strict=False))
        assert s.token_times_s[0] >= s.arrival_s
        recomputed += s.num_preemptions
    computed_once = sum(s.num_prompt_tokens + s.max_tokens - 1 for s in seqs)
    assert executor.tokens_computed >= computed_once
    if recomputed == 0:
        assert executor.tokens_computed == computed_once
    if budget is not None:
        assert all(r.num_tokens <= budget for r in engine.history)


def test_preemption_happens_and_recovers():
    bm = BlockManager(6, 4)  # 24 slots; four requests of 4 + 12 tokens need 16 each
    executor = ShadowKVExecutor(bm)
    engine = Engine(executor, ChunkedPrefillScheduler(16), bm, clock=VirtualClock())
    seqs = [engine.add_request([1, 2, 3, 4], max_tokens=12) for _ in range(4)]
    engine.run_until_done()
    assert sum(s.num_preemptions for s in seqs) > 0
    assert any(r.num_preempted for r in engine.history)
    assert bm.num_free_blocks == 6
    m = summarize(engine.finished)
    assert m.completed == 4 and m.total_output_tokens == 48
    c = engine.counters  # what /metrics exports, counted as vLLM counts it
    assert (
        c.num_preemptions
        == sum(r.num_preempted for r in engine.history)
        == sum(s.num_preemptions for s in seqs)
    )
    # each prompt once, despite recomputes
    assert c.num_generation_tokens == 48 and c.num_prompt_tokens == 4 * 4
    assert c.prefix_cache_queries == c.prefix_cache_hits == 0  # no prefix caching: no lookups


def test_prefill_first_chunking_still_stalls_decodes():
    def max_itl(scheduler):
        engine = toy_engine(scheduler, num_blocks=512)
        streams = [engine.add_request([1] * 16, max_tokens=40, arrival_s=0.0) for _ in range(4)]
        engine.add_request([1] * 2000, max_tokens=2, arrival_s=0.05)
        engine.run_until_done()
        return max(g for s in streams for g in s.itl_s)

    # 2000 tokens in 32 chunks of 64: every chunk runs before the next decode, so the gap is the whole
    # prefill (~1 s + 32 step overheads), about as long as the monolithic stall
    assert max_itl(PrefillFirstChunkedScheduler(64)) > 1.0


def test_abort_frees_blocks_and_leaves_the_queues():
    engine = toy_engine(ChunkedPrefillScheduler(8), num_blocks=16)
    a = engine.add_request([1] * 20, max_tokens=5)
    b = engine.add_request([1] * 4, max_tokens=5)
    engine.step()  # a gets 8 tokens of prefill
    assert engine.block_manager.num_free_blocks < 16
    assert engine.abort(a.seq_id) and not engine.abort(a.seq_id)
    assert a.finish_reason == "abort" and a in engine.aborted and a not in engine.finished
    engine.run_until_done()
    assert engine.finished == [b] and engine.block_manager.num_free_blocks == 16


def test_executor_with_its_own_pool_is_the_engines_pool():
    class PoolExecutor(ToyExecutor):
        block_manager = BlockManager(8, 4)

    ex = PoolExecutor()
    engine = Engine(ex, ChunkedPrefillScheduler(8), clock=VirtualClock())
    assert engine.block_manager is ex.block_manager
    # the same
    assert Engine(ex, ChunkedPrefillScheduler(8), ex.block_manager).block_manager is ex.block_manager
    with pytest.raises(ValueError, match="its own KV pool"):
        Engine(ex, ChunkedPrefillScheduler(8), BlockManager(8, 4))
    with pytest.raises(ValueError, match="its own KV pool"):
        Engine(ex, ChunkedPrefillScheduler(8), num_blocks=8)


# ---- the executor protocol ----
class Remembering(ToyExecutor):
    """A toy executor that refuses prompts over 30 tokens and records what the engine tells it to forget."""

    def __init__(self):
        super().__init__()
        self.forgotten: list[int] = []

    def check_prompt(self, num_tokens):
        if num_tokens > 30:
            raise ValueError(f"this executor runs prompts of at most 30 tokens, got {num_tokens}")

    def forget(self, seq_id):
        self.forgotten.append(seq_id)


def test_the_engine_calls_the_protocol_methods_and_refuses_a_non_executor():
    ex = Remembering()
    engine = Engine(ex, ChunkedPrefillScheduler(8), num_blocks=16, clock=VirtualClock())
    with pytest.raises(ValueError, match="at most 30 tokens"):
        engine.add_request([1] * 31, max_tokens=2)
    a, b = engine.add_request([1] * 20, max_tokens=3), engine.add_request([1] * 4, max_tokens=2)
    engine.step()
    engine.abort(a.seq_id)
    engine.run_until_done()
    assert ex.forgotten == [a.seq_id, b.seq_id]  # aborted, then finished: per-request state goes both ways

    class Duck:  # has execute, but is not an Executor: the engine would have to guess the rest
        def execute(self, batch):
            return ExecutionResult(0.0)

    with pytest.raises(ValueError, match="must be a longctx.engine.Executor"):
        Engine(Duck(), ChunkedPrefillScheduler(8), num_blocks=16)
    with pytest.raises(TypeError):
        Executor()  # execute is abstract: the one method every executor writes


def test_sampling_params_are_checked_and_ride_on_the_sequence():
    from longctx.engine import SamplingParams

    engine = toy_engine()
    seq = engine.add_request([1] * 4, max_tokens=2, sampling=SamplingParams(0.7, 0.9, seed=3))
    assert seq.sampling == SamplingParams(0.7, 0.9, 3) and not seq.sampling.greedy
    with pytest.raises(ValueError, match="SamplingParams or None"):
        engine.add_request([1] * 4, max_tokens=2, sampling={"temperature": 0.7})
    for bad in ({"temperature": 3.0}, {"top_p": 0.0}, {"seed": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
