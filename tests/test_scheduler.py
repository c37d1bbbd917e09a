"""Schedulers: the stall-free order, the budget, prefill-first, preemption through ``batch.add``."""

import sys

import pytest

from longctx.engine import (
    ChunkedPrefillScheduler,
    Engine,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    ScheduledBatch,
    Scheduler,
    ToyExecutor,
    VirtualClock,
)
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager


def make_running(bm, seq_id, prompt, computed, outputs=0):
    s = Sequence(seq_id, list(range(1, prompt + 1)), max_tokens=100)
    s.output_token_ids = [5] * outputs
    s.status = SequenceStatus.RUNNING
    s.num_computed_tokens = computed
    bm.allocate(seq_id, computed)
    return s


def schedule(policy, running, waiting, bm):
    batch = ScheduledBatch(bm, running, token_budget=policy.token_budget, max_num_seqs=policy.max_num_seqs)
    policy.schedule(running, waiting, batch)
    return batch


def test_stall_free_order_and_budget():
    bm = BlockManager(100, 16)
    d1 = make_running(bm, 0, prompt=10, computed=12, outputs=3)  # decode
    p1 = make_running(bm, 1, prompt=300, computed=64)  # prefill in progress
    d2 = make_running(bm, 2, prompt=20, computed=20, outputs=1)  # decode
    w1 = Sequence(3, list(range(1, 200)), max_tokens=4)
    w2 = Sequence(4, list(range(1, 50)), max_tokens=4)
    batch = schedule(ChunkedPrefillScheduler(token_budget=64), [d1, p1, d2], [w1, w2], bm)
    got = [(e.seq.seq_id, e.num_tokens) for e in batch.entries]
    assert got == [(0, 1), (2, 1), (1, 62)]  # decodes first, then the started prefill takes the rest
    assert batch.num_tokens == 64 and batch.num_decode_tokens == 2 and batch.num_prefill_tokens == 62
    batch = schedule(ChunkedPrefillScheduler(token_budget=300), [], [w1, w2], BlockManager(100, 16))
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 199), (4, 49)]
    batch = schedule(ChunkedPrefillScheduler(token_budget=210), [], [w1, w2], BlockManager(100, 16))
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 199), (4, 11)]


def test_monolithic_prefills_first_then_decodes():
    bm = BlockManager(100, 16)
    d1 = make_running(bm, 0, prompt=10, computed=12, outputs=3)
    w1 = Sequence(3, list(range(1, 1000)), max_tokens=4)
    batch = schedule(MonolithicScheduler(), [d1], [w1], bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 999)]  # the decode stalls
    batch = schedule(MonolithicScheduler(), [d1], [], bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(0, 1)]


def test_prefill_first_chunked_never_mixes_decodes_with_prefills():
    bm = BlockManager(100, 16)
    d1 = make_running(bm, 0, prompt=10, computed=12, outputs=3)
    p1 = make_running(bm, 1, prompt=300, computed=64)
    w1 = Sequence(3, list(range(1, 200)), max_tokens=4)
    policy = PrefillFirstChunkedScheduler(token_budget=64)
    got = [(e.seq.seq_id, e.num_tokens) for e in schedule(policy, [d1, p1], [w1], bm)]
    assert got == [(1, 64)]  # the prefill in progress takes the budget; the decode waits
    got = [(e.seq.seq_id, e.num_tokens) for e in schedule(policy, [d1], [w1], bm)]
    assert got == [(3, 64)]
    assert [(e.seq.seq_id, e.num_tokens) for e in schedule(policy, [d1], [], bm)] == [(0, 1)]


def test_add_preempts_newest_running_sequence_at_commit():
    bm = BlockManager(2, 4)
    old = make_running(bm, 0, prompt=3, computed=4, outputs=2)  # its block is full: next token needs one
    new = make_running(bm, 1, prompt=3, computed=4, outputs=2)
    running, waiting = [old, new], []
    batch = schedule(ChunkedPrefillScheduler(token_budget=8), list(running), waiting, bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(0, 1)]
    assert batch.preempted == [new] and bm.block_table(1) == []
    assert new.status is SequenceStatus.RUNNING  # nothing moves before commit
    batch.commit(running, waiting, now_s=1.0)
    assert running == [old] and waiting == [new]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.num_preemptions == 1


def test_only_newer_sequences_give_way():
    bm = BlockManager(2, 4)
    old = make_running(bm, 0, prompt=3, computed=4, outputs=2)
    new = make_running(bm, 1, prompt=3, computed=4, outputs=2)
    batch = ScheduledBatch(bm, [old, new])
    assert batch.add(new, 1) is False  # the newest cannot take the oldest's blocks: it preempts itself
    assert batch.preempted == [new] and batch.add(old, 1)


def test_add_refuses_illegal_entries_with_a_reason():
    bm = BlockManager(10, 4)
    w = Sequence(0, [1] * 10, max_tokens=2)
    batch = ScheduledBatch(bm, [], token_budget=8, max_num_seqs=1)
    with pytest.raises(ValueError, match="schedule 1 to 10"):
        batch.add(w, 11)
    with pytest.raises(ValueError, match="schedule 1 to 10"):
        batch.add(w, 0)
    with pytest.raises(ValueError, match="over token_budget=8"):
        batch.add(w, 9)
    assert batch.add(w, 8) and batch.budget_left == 0
    with pytest.raises(ValueError, match="already in this batch"):
        batch.add(w, 1)
    other = Sequence(1, [1] * 3, max_tokens=2)
    batch.token_budget = None
    assert batch.add(other, 3) is False  # max_num_seqs=1 sequence already holds blocks
    assert ScheduledBatch(bm, []).add(other, 3)  # no limit: admitted


class ForgetfulScheduler(Scheduler):
    def schedule(self, running, waiting, batch):
        for seq in waiting:
            batch.entries.append((seq, seq.num_uncomputed_tokens))  # bypasses batch.add: no KV slots


class GreedyScheduler(Scheduler):
    token_budget = 4

    def schedule(self, running, waiting, batch):
        for seq in waiting:
            batch.add(seq, seq.num_uncomputed_tokens)


class LazyScheduler(Scheduler):
    def schedule(self, running, waiting, batch):
        pass


@pytest.mark.parametrize(
    ("scheduler", "error", "message"),
    [
        (ForgetfulScheduler(), ValueError, "batch.add"), (GreedyScheduler(), ValueError, "over token_budget"),
        (LazyScheduler(), RuntimeError, "empty"),
    ],
)
def test_engine_rejects_broken_schedulers(scheduler, error, message):
    engine = Engine(ToyExecutor(), scheduler, num_blocks=8, clock=VirtualClock())
    engine.add_request([1] * 10, max_tokens=2)
    with pytest.raises(error, match=message):
        engine.step()


def test_bad_scheduler_arguments():
    with pytest.raises(ValueError, match="token_budget"):
        ChunkedPrefillScheduler(token_budget=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        MonolithicScheduler(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="token_budget"):
        PrefillFirstChunkedScheduler(token_budget=2.5)


def test_engine_and_schedulers_do_not_import_torch():
    assert "longctx.engine.torch_executor" not in sys.modules or "torch" in sys.modules
    import subprocess

    code = (
        "import sys; import longctx.engine, longctx.request_metrics, longctx.kv.block_manager;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
