"""The simulator's hot path decides exactly what the general path decides: ``ScheduledBatch.add``'s shortcut
for a running decode whose last block has room, reached alone or through ``ScheduledBatch.add_decodes`` (a
stall-free policy's first loop in one call), for decodes with and without room, preemptions, budgets and
prefix caching."""

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.engine.batch import ScheduledBatch
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager

running = st.lists(st.tuples(st.integers(1, 40),  # prompt tokens
                             st.integers(1, 6),  # outputs so far
                             st.booleans(),  # a decode (else a prefill part-way, no outputs)
                             st.booleans()),  # already holds the block its next token needs
                   min_size=1, max_size=24)


def _world(spec, free_blocks, caching):
    bm = BlockManager(400, 4, enable_prefix_caching=caching)
    seqs = []
    for i, (prompt, outs, decode, room) in enumerate(spec):
        s = Sequence(i, [i + 1] * prompt, max_tokens=64)
        s.status = SequenceStatus.RUNNING
        s.output_token_ids = [0] * outs if decode else []
        s.num_computed_tokens = prompt + outs - 1 if decode else max(1, prompt // 2)
        bm.allocate(i, s.num_computed_tokens + (1 if room else 0))
        seqs.append(s)
    spare = bm.num_free_blocks - free_blocks
    if spare > 0:
        bm.allocate(10_000, spare * bm.block_size)  # another sequence holds the rest of the pool
    return bm, seqs


def _outcome(batch, bm, others):
    return (
        [(e.seq.seq_id, e.num_tokens) for e in batch.entries], [s.seq_id for s in others],
        [s.seq_id for s in batch.preempted], batch.num_tokens, batch.num_decode_tokens, bm.num_free_blocks,
        copy.deepcopy(bm._tables), copy.deepcopy(bm._block_of),
    )


def _one_by_one(batch, seqs):
    """The per-sequence loop ``add_decodes`` replaces (every decode through ``add``)."""
    others = []
    for s in seqs:
        if not s.is_decode:
            others.append(s)
        elif batch.token_budget is None or batch.budget_left:
            batch.add(s, 1)
    return others


class _NoShortcut(ScheduledBatch):
    """``add`` without its shortcut: every call takes the general path."""

    def _fits_one_more(self, seq):
        return False


@settings(max_examples=150, deadline=None)
@given(running, st.integers(0, 30), st.sampled_from([None, 3, 8, 64]), st.booleans())
def test_the_shortcuts_decide_what_the_general_path_decides(spec, free_blocks, budget, caching):
    results = []
    for how in ("add_decodes", "add", "general"):
        bm, seqs = _world(spec, free_blocks, caching)
        cls = _NoShortcut if how == "general" else ScheduledBatch
        batch = cls(bm, list(seqs), token_budget=budget, max_num_seqs=256)
        others = batch.add_decodes(seqs) if how == "add_decodes" else _one_by_one(batch, seqs)
        bm.check_invariants()
        results.append(_outcome(batch, bm, others))
    assert results[0] == results[1] == results[2]


def test_a_batch_that_watches_add_sees_every_decode():
    """A subclass that overrides ``add`` (the lessons' policy checks record it) sees each decode through
    it."""
    bm, seqs = _world([(8, 2, True, True), (8, 0, False, True), (8, 3, True, False)], 10, False)
    calls = []

    class Watching(ScheduledBatch):
        def add(self, seq, num_tokens):
            calls.append((seq.seq_id, num_tokens))
            return super().add(seq, num_tokens)

    batch = Watching(bm, list(seqs), token_budget=64)
    assert [s.seq_id for s in batch.add_decodes(seqs)] == [1]
    assert calls == [(0, 1), (2, 1)] and len(batch) == 2


def test_add_decodes_stops_at_the_budget_and_skips_preempted_sequences():
    bm, seqs = _world([(8, 1, True, True)] * 3 + [(8, 1, True, False)], 0, False)
    batch = ScheduledBatch(bm, list(seqs), token_budget=3)
    assert batch.add_decodes(seqs) == [] and [e.seq.seq_id for e in batch] == [0, 1, 2]
    batch = ScheduledBatch(bm, list(seqs), token_budget=None)
    batch.add(seqs[3], 1)  # needs a block, none is free: preempts the newest other (it is itself the newest)
    assert [s.seq_id for s in batch.preempted] == [3]
    assert batch.add_decodes(seqs) == [] and [e.seq.seq_id for e in batch] == [0, 1, 2]


def test_the_engine_reuses_a_decodes_entry_and_forgets_it_when_the_sequence_ends():
    from longctx.engine import ChunkedPrefillScheduler, Engine, ToyExecutor, VirtualClock

    engine = Engine(
        ToyExecutor(), ChunkedPrefillScheduler(64), num_blocks=64, block_size=4, clock=VirtualClock()
    )
    seqs = [engine.add_request([1] * 10, max_tokens=6) for _ in range(4)]
    engine.step()  # prefills all four
    engine.step()  # their first decodes
    first = engine.new_batch()  # two batches of the same state (the next step, twice)
    engine.scheduler.schedule(first.running, list(engine.waiting), first)
    second = engine.new_batch()
    engine.scheduler.schedule(second.running, list(engine.waiting), second)
    assert [e.seq for e in first.entries] == [e.seq for e in second.entries] == engine.running
    assert all(a is b for a, b in zip(first.entries, second.entries, strict=True))  # one tuple per decode
    assert engine.abort(seqs[0].seq_id)
    engine.run_until_done()
    assert engine._decode_chunks == {}  # finished and aborted sequences leave nothing behind
