"""Schedulers: the stall-free order, the budget, prefill-first, preemption through ``reserve``."""

import sys

import pytest

from longctx.engine import (
    ChunkedPrefillScheduler,
    Engine,
    MonolithicScheduler,
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


def test_stall_free_order_and_budget():
    bm = BlockManager(100, 16)
    d1 = make_running(bm, 0, prompt=10, computed=12, outputs=3)  # decode
    p1 = make_running(bm, 1, prompt=300, computed=64)  # prefill in progress
    d2 = make_running(bm, 2, prompt=20, computed=20, outputs=1)  # decode
    w1 = Sequence(3, list(range(1, 200)), max_tokens=4)
    w2 = Sequence(4, list(range(1, 50)), max_tokens=4)
    batch = ChunkedPrefillScheduler(token_budget=64).schedule([d1, p1, d2], [w1, w2], bm)
    got = [(e.seq.seq_id, e.num_tokens) for e in batch.entries]
    assert got == [(0, 1), (2, 1), (1, 62)]  # decodes first, then the started prefill takes the rest
    assert batch.num_tokens == 64 and batch.num_decode_tokens == 2 and batch.num_prefill_tokens == 62
    batch = ChunkedPrefillScheduler(token_budget=300).schedule([], [w1, w2], BlockManager(100, 16))
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 199), (4, 49)]
    batch = ChunkedPrefillScheduler(token_budget=210).schedule([], [w1, w2], BlockManager(100, 16))
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 199), (4, 11)]


def test_monolithic_prefills_first_then_decodes():
    bm = BlockManager(100, 16)
    d1 = make_running(bm, 0, prompt=10, computed=12, outputs=3)
    w1 = Sequence(3, list(range(1, 1000)), max_tokens=4)
    batch = MonolithicScheduler().schedule([d1], [w1], bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(3, 999)]  # the decode stalls
    batch = MonolithicScheduler().schedule([d1], [], bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(0, 1)]


def test_reserve_preempts_newest_running_sequence():
    bm = BlockManager(2, 4)
    old = make_running(bm, 0, prompt=3, computed=4, outputs=2)  # its block is full: next token needs one
    new = make_running(bm, 1, prompt=3, computed=4, outputs=2)
    batch = ChunkedPrefillScheduler(token_budget=8).schedule([old, new], [], bm)
    assert [(e.seq.seq_id, e.num_tokens) for e in batch.entries] == [(0, 1)]
    assert batch.preempted == [new]
    assert new.status is SequenceStatus.WAITING and new.num_computed_tokens == 0
    assert new.num_preemptions == 1 and not bm.has(1)


class ForgetfulScheduler(Scheduler):
    def schedule(self, running, waiting, block_manager):
        batch = ScheduledBatch()
        for seq in waiting:
            batch.add(seq, seq.num_uncomputed_tokens)  # no reserve: no KV slots
        return batch


class GreedyScheduler(Scheduler):
    token_budget = 4

    def schedule(self, running, waiting, block_manager):
        batch = ScheduledBatch()
        for seq in waiting:
            self.reserve(batch, seq, seq.num_uncomputed_tokens, running, block_manager)
        return batch


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [(ForgetfulScheduler(), "without reserving"), (GreedyScheduler(), "over token_budget")],
)
def test_engine_rejects_broken_schedulers(scheduler, message):
    engine = Engine(ToyExecutor(), scheduler, num_blocks=8, clock=VirtualClock())
    engine.add_request([1] * 10, max_tokens=2)
    with pytest.raises(RuntimeError, match=message):
        engine.step()


def test_bad_scheduler_arguments():
    with pytest.raises(ValueError, match="token_budget"):
        ChunkedPrefillScheduler(token_budget=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        MonolithicScheduler(max_num_batched_tokens=0)


def test_engine_and_schedulers_do_not_import_torch():
    assert "longctx.engine.torch_executor" not in sys.modules or "torch" in sys.modules
    import subprocess

    code = (
        "import sys; import longctx.engine, longctx.engine.metrics, longctx.kv.block_manager;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
