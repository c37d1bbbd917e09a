"""The engine loop: admit arrivals, schedule, execute, timestamp the new tokens, free finished sequences.

One loop for both executors: ``TorchExecutor`` with a ``WallClock`` is a real (small) inference engine;
a cost-model executor with a ``VirtualClock`` is the simulator. Nothing here imports torch.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from longctx.engine.clock import Clock, WallClock
from longctx.engine.executor import Executor
from longctx.engine.scheduler import ScheduledBatch, Scheduler
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager, blocks_for_tokens

DEFAULT_MAX_MODEL_LEN = 8192  # SmolLM2's context length (its GGUF's llama.context_length)


@dataclass(frozen=True)
class StepRecord:
    """What one step did, for timelines: times in seconds on the engine clock."""

    start_s: float
    end_s: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    seq_ids: tuple[int, ...]
    chunk_tokens: tuple[int, ...]
    num_preempted: int
    num_free_blocks: int

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class Engine:
    """A continuous-batching engine over a paged KV cache.

    Args:
        executor: runs a ``ScheduledBatch`` (``TorchExecutor``, a cost model, ``ToyExecutor``).
        scheduler: a ``Scheduler`` subclass instance (the policy).
        block_manager: the KV pool's bookkeeping; or give ``num_blocks`` (and ``block_size``) instead. It
            must describe the same pool as the executor's cache.
        clock: ``WallClock()`` by default; a ``VirtualClock`` for simulation.
        max_model_len: longest prompt accepted, in tokens.
        eos_token_id: default end-of-sequence token (only checked when the executor returns real tokens).
        vocab_size: when given, prompts with token ids outside ``[0, vocab_size)`` are refused.
    """

    def __init__(
        self,
        executor: Executor,
        scheduler: Scheduler,
        block_manager: BlockManager | None = None,
        *,
        num_blocks: int | None = None,
        block_size: int = 16,
        clock: Clock | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        eos_token_id: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if block_manager is None:
            if num_blocks is None:
                raise ValueError("give either block_manager or num_blocks")
            block_manager = BlockManager(num_blocks, block_size)
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self.executor = executor
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.clock = clock if clock is not None else WallClock()
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size
        self.pending: list[Sequence] = []  # added, arrival_s in the future (sorted by arrival)
        self.waiting: list[Sequence] = []  # arrived, no KV blocks (new or preempted), queue order
        self.running: list[Sequence] = []  # hold KV blocks, oldest first
        self.finished: list[Sequence] = []  # in finishing order
        self.history: list[StepRecord] = []
        self._next_id = 0

    # ---- requests ----
    def add_request(
        self,
        prompt_token_ids: list[int],
        max_tokens: int,
        arrival_s: float | None = None,
        eos_token_id: int | None = None,
    ) -> Sequence:
        """Admit a request; returns its ``Sequence`` (timestamps fill in as it runs).

        ``arrival_s`` is on the engine clock (default: now); a future arrival waits in ``pending``.
        Raises ``ValueError`` for an empty prompt, a prompt over ``max_model_len``, ``max_tokens < 1``, or
        a request whose prompt + max_tokens cannot fit in the whole KV pool.
        """
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, more than max_model_len={self.max_model_len}"
            )
        if self.vocab_size is not None and not all(0 <= t < self.vocab_size for t in ids):
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if int(max_tokens) != max_tokens or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        bm = self.block_manager
        need = blocks_for_tokens(len(ids) + int(max_tokens), bm.block_size)
        if need > bm.num_blocks:
            raise ValueError(
                f"the request needs {need} KV blocks of {bm.block_size} tokens ({len(ids)} prompt + "
                f"{max_tokens} output tokens) but the pool has only {bm.num_blocks}"
            )
        now = self.clock.now()
        seq = Sequence(
            seq_id=self._next_id,
            prompt_token_ids=ids,
            max_tokens=int(max_tokens),
            arrival_s=now if arrival_s is None else float(arrival_s),
            eos_token_id=self.eos_token_id if eos_token_id is None else eos_token_id,
        )
        self._next_id += 1
        if seq.arrival_s <= now:
            self.waiting.append(seq)
        else:
            bisect.insort(self.pending, seq, key=lambda s: s.arrival_s)
        return seq

    def abort(self, seq_id: int) -> bool:
        """Drop an unfinished request (a client went away): free its KV blocks, remove it from the queues.

        The sequence ends with ``finish_reason == "abort"`` and is *not* added to ``finished`` (it has no
        complete timings). Returns False when no unfinished sequence has that id (already done: a no-op).
        """
        for queue in (self.pending, self.waiting, self.running):
            for seq in queue:
                if seq.seq_id == seq_id:
                    queue.remove(seq)
                    if self.block_manager.has(seq_id):
                        self.block_manager.free(seq_id)
                    seq.status = SequenceStatus.FINISHED
                    seq.finish_reason = "abort"
                    seq.finished_s = self.clock.now()
                    return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence added so far, by id."""
        every = self.pending + self.waiting + self.running + self.finished
        return sorted(every, key=lambda s: s.seq_id)

    # ---- the loop ----
    def _admit_arrivals(self) -> None:
        now = self.clock.now()
        while self.pending and self.pending[0].arrival_s <= now:
            self.waiting.append(self.pending.pop(0))

    def step(self) -> StepRecord | None:
        """Run one iteration. Returns its record, or None when there was nothing to do."""
        self._admit_arrivals()
        if not (self.waiting or self.running):
            if not self.pending:
                return None
            self.clock.wait_until(self.pending[0].arrival_s)  # idle until the next arrival
            self._admit_arrivals()
        batch = self.scheduler.schedule(list(self.running), list(self.waiting), self.block_manager)
        self._apply_preemptions(batch)
        self._check(batch)
        num_prefill, num_decode = batch.num_prefill_tokens, batch.num_decode_tokens
        for e in batch.entries:  # admitted this step
            if e.seq.status is SequenceStatus.WAITING:
                self.waiting.remove(e.seq)
                self.running.append(e.seq)
                e.seq.status = SequenceStatus.RUNNING
                if e.seq.first_scheduled_s is None:
                    e.seq.first_scheduled_s = self.clock.now()
        batch.block_tables = {e.seq.seq_id: self.block_manager.block_table(e.seq.seq_id) for e in batch}
        start_s = self.clock.now()
        result = self.executor.execute(batch)
        self.clock.advance(result.duration_s)
        end_s = self.clock.now()
        self._update(batch, result.next_token_ids, end_s)
        record = StepRecord(
            start_s=start_s,
            end_s=end_s,
            duration_s=float(result.duration_s),
            num_prefill_tokens=num_prefill,
            num_decode_tokens=num_decode,
            seq_ids=tuple(e.seq.seq_id for e in batch),
            chunk_tokens=tuple(e.num_tokens for e in batch),
            num_preempted=len(batch.preempted),
            num_free_blocks=self.block_manager.num_free_blocks,
        )
        self.history.append(record)
        return record

    def run_until_done(self, max_steps: int | None = None) -> list[Sequence]:
        """Step until every request has finished; returns the finished sequences (finishing order)."""
        steps = 0
        while self.has_unfinished():
            if max_steps is not None and steps >= max_steps:
                raise RuntimeError(f"not done after max_steps={max_steps} steps")
            self.step()
            steps += 1
        return self.finished

    # ---- internals ----
    def _apply_preemptions(self, batch: ScheduledBatch) -> None:
        for seq in batch.preempted:
            if seq in self.running:
                self.running.remove(seq)
        # Preempted sequences go to the front of the queue, oldest first.
        self.waiting[:0] = [s for s in self.running_order(batch.preempted) if s not in self.waiting]

    @staticmethod
    def running_order(seqs: list[Sequence]) -> list[Sequence]:
        return sorted(seqs, key=lambda s: (s.arrival_s, s.seq_id))

    def _check(self, batch: ScheduledBatch) -> None:
        name = type(self.scheduler).__name__
        if not batch.entries:
            raise RuntimeError(
                f"{name}.schedule returned an empty batch although {len(self.running)} sequences run and "
                f"{len(self.waiting)} wait: the engine would never finish"
            )
        seen: set[int] = set()
        for seq, n in batch.entries:
            if seq.seq_id in seen:
                raise RuntimeError(f"{name} scheduled sequence {seq.seq_id} twice in one batch")
            seen.add(seq.seq_id)
            if not 1 <= n <= seq.num_uncomputed_tokens:
                raise RuntimeError(
                    f"{name} scheduled {n} tokens of sequence {seq.seq_id}, which has "
                    f"{seq.num_uncomputed_tokens} left to compute (allowed: 1 to that)"
                )
            if self.block_manager.num_tokens(seq.seq_id) < seq.num_computed_tokens + n:
                raise RuntimeError(
                    f"{name} scheduled {n} tokens of sequence {seq.seq_id} without reserving their KV "
                    f"slots: add entries with self.reserve(batch, seq, n, running, block_manager)"
                )
        budget = getattr(self.scheduler, "token_budget", None)
        if budget is not None and batch.num_tokens > budget:
            raise RuntimeError(f"{name} scheduled {batch.num_tokens} tokens, over token_budget={budget}")

    def _update(self, batch: ScheduledBatch, next_token_ids: list[int] | None, now_s: float) -> None:
        if next_token_ids is not None and len(next_token_ids) != len(batch.entries):
            raise RuntimeError(
                f"the executor returned {len(next_token_ids)} tokens for {len(batch.entries)} entries"
            )
        for i, (seq, n) in enumerate(batch.entries):
            seq.num_computed_tokens += n
            if seq.num_uncomputed_tokens > 0:
                continue  # a prefill chunk that is not the last: no token yet
            token = 0 if next_token_ids is None else int(next_token_ids[i])
            seq.output_token_ids.append(token)
            seq.token_times_s.append(now_s)
            if seq.num_output_tokens >= seq.max_tokens:
                self._finish(seq, "length", now_s)
            elif next_token_ids is not None and seq.eos_token_id is not None and token == seq.eos_token_id:
                self._finish(seq, "stop", now_s)

    def _finish(self, seq: Sequence, reason: str, now_s: float) -> None:
        self.block_manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_s = now_s
        self.running.remove(seq)
        self.finished.append(seq)
