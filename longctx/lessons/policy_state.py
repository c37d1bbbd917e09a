"""A scheduling policy's view of one step as plain data, and its decisions on that view (lesson 02).

Lesson 02's exercise asks the learner to write ``schedule`` for a token-budget scheduler. Its check
(``longctx.lessons.policy_checks``) may run in another process than the learner's code (the grader's
pristine checker), so the policy and the check talk in plain data only:

- ``scheduler_state(running, waiting, block_manager) -> dict``: what the policy sees at one step;
- ``decide(scheduler, state) -> [[seq_id, num_tokens], ...]``: rebuilds mirror sequences and a block
  manager from the state (``manager_with_tables``), runs ``scheduler.schedule`` on them and returns its
  ``batch.add`` calls in order (an ``add`` that returned False is listed too: it may have preempted, and
  replaying it does the same). Decisions taken inside the library's ``ChunkedPrefillScheduler``
  (inherited or called) are refused: the exercise is to write one.
"""

from __future__ import annotations

import sys

from longctx.engine.batch import ScheduledBatch
from longctx.engine.scheduler import DEFAULT_MAX_NUM_SEQS, ChunkedPrefillScheduler, Scheduler
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager

_LIBRARY_POLICY_CODE = {ChunkedPrefillScheduler.schedule.__code__}


def manager_with_tables(num_blocks: int, block_size: int, tables: dict[int, list[int]],
                        num_free_blocks: int | None = None) -> BlockManager:
    """A ``BlockManager`` whose sequences already hold ``tables`` (a snapshot of another pool, e.g. the
    state a policy check replays), with ``num_free_blocks`` of the remaining blocks free (default: all)."""
    bm = BlockManager(num_blocks, block_size)
    bm.restore(tables, num_free_blocks)
    return bm


def _seq_state(seq: Sequence, block_manager: BlockManager) -> dict:
    return {
        "seq_id": int(seq.seq_id),
        "num_prompt_tokens": int(seq.num_prompt_tokens),
        "num_output_tokens": int(seq.num_output_tokens),
        "num_computed_tokens": int(seq.num_computed_tokens),
        "max_tokens": int(seq.max_tokens),
        "arrival_s": float(seq.arrival_s),
        "block_table": [int(b) for b in block_manager.block_table(seq.seq_id)],
    }


def scheduler_state(running: list[Sequence], waiting: list[Sequence], block_manager: BlockManager) -> dict:
    """What a policy sees at one step, as plain data (ints, floats, lists, dicts)."""
    return {
        "num_blocks": block_manager.num_blocks,
        "block_size": block_manager.block_size,
        "num_free_blocks": block_manager.num_free_blocks,
        "running": [_seq_state(s, block_manager) for s in running],
        "waiting": [_seq_state(s, block_manager) for s in waiting],
    }


def _mirror(d: dict, status: SequenceStatus) -> Sequence:
    seq = Sequence(d["seq_id"], [0] * d["num_prompt_tokens"], d["max_tokens"], arrival_s=d["arrival_s"])
    seq.output_token_ids = [0] * d["num_output_tokens"]
    seq.num_computed_tokens = d["num_computed_tokens"]
    seq.status = status
    return seq


class _RecordingBatch(ScheduledBatch):
    """A batch that lists every ``add`` call and refuses calls made inside the library's policy."""

    calls: list
    allow_library: bool = False

    def add(self, seq, num_tokens):
        if not self.allow_library:
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_code in _LIBRARY_POLICY_CODE:
                    raise AssertionError(
                        "your schedule hands the decision to the library's ChunkedPrefillScheduler "
                        "(inherited or called): write the three loops yourself, with batch.add"
                    )
                frame = frame.f_back
        self.calls.append([int(seq.seq_id), num_tokens])
        return super().add(seq, num_tokens)


def decide(scheduler: Scheduler, state: dict, *, allow_library: bool = False) -> list[list[int]]:
    """Run ``scheduler.schedule`` on mirrors of ``state``; returns its ``batch.add`` calls in order.

    Runs in the learner's kernel; everything in and out is plain data. ``allow_library`` lets the
    library's own policies be checked (they are refused by default: the exercise is to write one).
    """
    # the same tables and number of free blocks; which ids are free does not change a decision
    tables = {d["seq_id"]: d["block_table"] for d in state["running"]}
    bm = manager_with_tables(state["num_blocks"], state["block_size"], tables, state["num_free_blocks"])
    running = [_mirror(d, SequenceStatus.RUNNING) for d in state["running"]]
    waiting = [_mirror(d, SequenceStatus.WAITING) for d in state["waiting"]]
    batch = _RecordingBatch(
        bm,
        list(running),
        token_budget=getattr(scheduler, "token_budget", None),
        max_num_seqs=getattr(scheduler, "max_num_seqs", DEFAULT_MAX_NUM_SEQS),
    )
    batch.calls, batch.allow_library = [], allow_library
    scheduler.schedule(running, waiting, batch)
    return [[int(i), int(n)] for i, n in batch.calls]
