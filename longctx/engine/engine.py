"""The engine loop: admit arrivals, schedule, execute, timestamp the new tokens, free finished sequences.

One loop for both executors: ``TorchExecutor`` with a ``WallClock`` is a real (small) inference engine;
a cost-model executor with a ``VirtualClock`` is the simulator. Each step is

    batch = ScheduledBatch(...); scheduler.schedule(running, waiting, batch)   # decide (reserves KV)
    batch.commit(running, waiting, now)                                         # move queues, flip states
    result = executor.execute(batch)                                            # run (or model) the step
    update: count computed tokens, append sampled tokens with their time, free finished sequences

Nothing here imports torch.
"""

from __future__ import annotations

import bisect
from operator import attrgetter, itemgetter

from longctx.engine.admission import check_fits_pool, check_max_tokens, check_prompt_ids
from longctx.engine.batch import ScheduledBatch
from longctx.engine.clock import Clock, WallClock
from longctx.engine.executor import Executor
from longctx.engine.sampling_params import SamplingParams
from longctx.engine.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler
from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.engine.step_records import EngineCounters, StepRecord
from longctx.kv.block_manager import BlockManager

DEFAULT_MAX_MODEL_LEN = 8192  # SmolLM2's context length (its GGUF's llama.context_length)

__all__ = ["DEFAULT_MAX_MODEL_LEN", "Engine", "EngineCounters", "StepRecord"]
_SEQ_ID, _NUM_TOKENS = attrgetter("seq.seq_id"), itemgetter(1)  # of a ScheduledChunk (StepRecord, per step)


class Engine:
    """A continuous-batching engine over a paged KV cache.

    Args:
        executor: an ``Executor`` (``TorchExecutor``, a cost model, ``ToyExecutor``, or your subclass). An
            executor with a KV cache of its own (``TorchExecutor``) carries its pool as
            ``executor.block_manager``: the engine uses that one, so the bookkeeping and the tensors describe
            one pool.
        scheduler: the policy: a ``Scheduler`` subclass instance (anything with ``schedule(running,
            waiting, batch)`` and optional ``token_budget`` / ``max_num_seqs`` attributes).
        block_manager: the KV pool's bookkeeping for an executor without a cache of its own; or give
            ``num_blocks`` (and ``block_size``) instead.
        clock: ``WallClock()`` by default; a ``VirtualClock`` for simulation.
        max_model_len: longest prompt accepted, in tokens.
        eos_token_id: default end-of-sequence token (only checked when the executor returns real tokens).
        vocab_size: when given, prompts with token ids outside ``[0, vocab_size)`` are refused.

    ``counters`` (``EngineCounters``) keeps running totals (tokens, preemptions, prefix-cache lookups).
    """

    def __init__(
        self, executor: Executor, scheduler: Scheduler, block_manager: BlockManager | None = None, *,
        num_blocks: int | None = None, block_size: int = 16, clock: Clock | None = None,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN, eos_token_id: int | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if not isinstance(executor, Executor):
            raise ValueError(
                f"executor must be a longctx.engine.Executor (subclass it and write execute(batch)), "
                f"got {type(executor).__name__}"
            )
        block_manager = self._pool(executor.block_manager, block_manager, num_blocks, block_size)
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
        self.aborted: list[Sequence] = []  # dropped by abort(), in abort order
        self.history: list[StepRecord] = []
        self.counters = EngineCounters()
        self._next_id = 0
        self._decode_chunks: dict = {}  # seq id -> ScheduledChunk(seq, 1), reused by each step's batch

    @staticmethod
    def _pool(own: BlockManager | None, given: BlockManager | None, num_blocks: int | None,
              block_size: int) -> BlockManager:
        """The one KV pool: the executor's own, else the one given, else a new one of ``num_blocks``."""
        if own is not None:
            another_pool = given is not None and given is not own
            if another_pool or num_blocks is not None:
                raise ValueError(
                    "the executor has its own KV pool (executor.block_manager); do not give the engine "
                    "another block_manager or num_blocks"
                )
            return own
        if given is not None:
            return given
        if num_blocks is None:
            raise ValueError("give either block_manager or num_blocks")
        return BlockManager(num_blocks, block_size)

    # ---- requests ----
    def add_request(
        self, prompt_token_ids: list[int], max_tokens: int, arrival_s: float | None = None,
        eos_token_id: int | None = None, sampling: SamplingParams | None = None,
    ) -> Sequence:
        """Admit a request; returns its ``Sequence`` (timestamps fill in as it runs).

        ``arrival_s`` is on the engine clock (default: now); a future arrival waits in ``pending``.
        ``sampling``: how its tokens are chosen (None: greedy; executors without real tokens ignore it).
        Raises ``ValueError`` for an empty prompt, a prompt over ``max_model_len``, ``max_tokens < 1``, a
        prompt the executor refuses (``Executor.check_prompt``), or a request whose prompt + max_tokens
        cannot fit in the whole KV pool (``admission.check_fits_pool``).
        """
        ids = check_prompt_ids(prompt_token_ids, self.max_model_len, self.vocab_size)
        max_tokens = check_max_tokens(max_tokens)
        if sampling is not None and not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams or None, got {type(sampling).__name__}")
        self.executor.check_prompt(len(ids))  # e.g. a KV press whose window is longer than the prompt
        check_fits_pool(self.block_manager, len(ids), max_tokens)
        now = self.clock.now()
        seq = Sequence(
            seq_id=self._next_id, prompt_token_ids=ids, max_tokens=max_tokens,
            arrival_s=now if arrival_s is None else float(arrival_s),
            eos_token_id=self.eos_token_id if eos_token_id is None else eos_token_id, sampling=sampling,
        )
        self._next_id += 1
        if seq.arrival_s <= now:
            self.waiting.append(seq)
        elif not self.pending or self.pending[-1].arrival_s <= seq.arrival_s:
            self.pending.append(seq)  # arrivals in order (a workload): no search
        else:
            bisect.insort(self.pending, seq, key=lambda s: s.arrival_s)
        return seq

    def abort(self, seq_id: int) -> bool:
        """Drop an unfinished request (a client went away): free its KV blocks, remove it from the queues.

        The sequence ends with ``finish_reason == "abort"`` and goes to ``aborted``, not ``finished`` (it
        has no complete timings). Returns False when no unfinished sequence has that id (a no-op).
        """
        for queue in (self.pending, self.waiting, self.running):
            for seq in queue:
                if seq.seq_id == seq_id:
                    queue.remove(seq)
                    self.block_manager.free(seq_id)
                    self.executor.forget(seq_id)
                    self._decode_chunks.pop(seq_id, None)
                    seq.status = SequenceStatus.FINISHED
                    seq.finish_reason = "abort"
                    seq.finished_s = self.clock.now()
                    self.aborted.append(seq)
                    return True
        return False

    def has_unfinished(self) -> bool:
        return bool(self.pending or self.waiting or self.running)

    @property
    def sequences(self) -> list[Sequence]:
        """Every sequence added so far, by id."""
        every = self.pending + self.waiting + self.running + self.finished + self.aborted
        return sorted(every, key=lambda s: s.seq_id)

    # ---- the loop ----
    def _admit_arrivals(self) -> None:
        now, pending = self.clock.now(), self.pending
        i = 0
        while i < len(pending) and pending[i].arrival_s <= now:
            i += 1
        if i:
            self.waiting += pending[:i]
            del pending[:i]

    def new_batch(self) -> ScheduledBatch:
        """An empty batch over this engine's pool and running queue, with the scheduler's limits."""
        s = self.scheduler
        return ScheduledBatch(
            self.block_manager,
            list(self.running),
            token_budget=getattr(s, "token_budget", None),
            max_num_seqs=getattr(s, "max_num_seqs", DEFAULT_MAX_NUM_SEQS),
            # a decode's entry is the same tuple every step
            decode_chunks=self._decode_chunks,
        )

    def step(self) -> StepRecord | None:
        """Run one iteration. Returns its record, or None when there was nothing to do."""
        self._admit_arrivals()
        if not (self.waiting or self.running):
            if not self.pending:
                return None
            self.clock.wait_until(self.pending[0].arrival_s)  # idle until the next arrival
            self._admit_arrivals()
        batch = self.new_batch()
        self.scheduler.schedule(batch.running, list(self.waiting), batch)
        if not batch.entries:
            raise RuntimeError(
                f"{type(self.scheduler).__name__}.schedule left the batch empty although "
                f"{len(self.running)} sequences run and {len(self.waiting)} wait: "
                "the engine would never finish"
            )
        start_s = self.clock.now()
        c = self.counters
        c.prefix_cache_queries += batch.prefix_cache_queries
        c.prefix_cache_hits += batch.prefix_cache_hits
        c.num_preemptions += len(batch.preempted)
        batch.commit(self.running, self.waiting, start_s)
        held = self.block_manager.num_used_blocks
        result = self.executor.execute(batch)
        self.clock.advance(result.duration_s)
        end_s = self.clock.now()
        self._update(batch, result.next_token_ids, end_s, result.evicted_tokens)
        entries = batch.entries
        record = StepRecord(
            start_s=start_s, end_s=end_s, duration_s=float(result.duration_s),
            num_prefill_tokens=batch.num_prefill_tokens, num_decode_tokens=batch.num_decode_tokens,
            seq_ids=tuple(map(_SEQ_ID, entries)), chunk_tokens=tuple(map(_NUM_TOKENS, entries)),
            num_preempted=len(batch.preempted), num_free_blocks=self.block_manager.num_free_blocks,
            num_used_blocks=held,
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
    def _update(self, batch: ScheduledBatch, next_token_ids: list[int] | None, now_s: float,
                evicted: dict[int, int] | None = None) -> None:
        entries = batch.entries
        if next_token_ids is not None and len(next_token_ids) != len(entries):
            raise RuntimeError(
                f"the executor returned {len(next_token_ids)} tokens for {len(entries)} entries"
            )
        done = []
        bm, c = self.block_manager, self.counters
        real = next_token_ids is not None  # else no tokens (the simulator): every output is 0
        num_prompt = num_generated = 0
        i = -1
        for seq, n in entries:
            i += 1
            computed = seq.num_computed_tokens = seq.num_computed_tokens + n  # (blocks cached in batch.add)
            if evicted and seq.seq_id in evicted:  # KV pruning: the pool gets the blocks past the kept tokens
                seq.num_evicted_tokens += evicted[seq.seq_id]
                c.num_press_evicted_tokens += evicted[seq.seq_id]
                c.num_press_freed_blocks += bm.shrink(seq.seq_id, seq.num_cached_tokens)
            outputs, prompt = seq.output_token_ids, len(seq.prompt_token_ids)
            if prompt + len(outputs) > computed:
                continue  # a prefill chunk that is not the last: no token yet
            token = int(next_token_ids[i]) if real else 0
            if not outputs:
                num_prompt += prompt
            outputs.append(token)
            seq.token_times_s.append(now_s)
            num_generated += 1
            if len(outputs) >= seq.max_tokens:
                done.append((seq, "length"))
            elif real and token == seq.eos_token_id:
                done.append((seq, "stop"))
        c.num_prompt_tokens += num_prompt
        c.num_generation_tokens += num_generated
        if done:
            self._finish(done, now_s)

    def _finish(self, done: list[tuple[Sequence, str]], now_s: float) -> None:
        """Free the blocks of the sequences that finished this step; move them to ``finished``."""
        for seq, reason in done:
            self.block_manager.free(seq.seq_id)
            self.executor.forget(seq.seq_id)
            self._decode_chunks.pop(seq.seq_id, None)
            seq.status = SequenceStatus.FINISHED
            seq.finish_reason = reason
            seq.finished_s = now_s
            self.finished.append(seq)
        ids = {seq.seq_id for seq, _ in done}
        self.running[:] = [s for s in self.running if s.seq_id not in ids]
