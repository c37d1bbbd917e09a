"""One step's batch, and the one object that reserves KV slots for it.

A policy fills a ``ScheduledBatch`` with ``batch.add(seq, num_tokens) -> bool``. ``add`` does all the
bookkeeping a step needs, so a policy reads like the paper's pseudo-code:

- it checks the entry (``1 <= num_tokens <= seq.num_uncomputed_tokens``, once per sequence, within the
  token budget) and raises ``ValueError`` with the reason when the policy asks for something illegal;
- it reserves the entry's KV slots in the block manager; a waiting sequence is admitted only if the pool
  could hold its whole prompt (not just this chunk: vLLM's rule, so that an admitted prefill is rarely
  preempted halfway) and fewer than ``max_num_seqs`` sequences would hold blocks;
- with prefix caching, a waiting sequence whose first full blocks are cached takes them (in the block
  manager, at once) and ``commit`` counts their tokens as computed: ``add(seq, n)`` then computes
  ``min(n, tokens left after the hit)`` tokens, starting after the hit (the policy's budget is not charged
  for the hit; the entry's ``num_tokens`` says how many). Every block an entry fills
  enters the cache as soon as the entry is added (vLLM caches a full block when it allocates it), so a
  sequence added *later in the same step* already hits it: the executor writes the K/V of every token of a
  step, layer by layer, before any attention of that layer reads the cache (``longctx.model.llama``), so
  the sharer reads exactly what a later step would read;
- a running sequence short of blocks takes them from running sequences *newer* than itself that are not
  in the batch, newest first (preemption by recompute, vLLM's policy); if none is left it is preempted
  itself. ``add`` returns False when the sequence cannot run this step.

``add_decodes(seqs)`` is ``add(seq, 1)`` for each decode of ``seqs`` in one call (a stall-free policy's first
loop; the simulator spends most of its time there, in ``add``'s short path for a decode whose last block has
room). ``ScheduledChunk`` lives in ``longctx.engine.sequence``
(import it from either module).

Sequences and queues do not change while the policy runs (only the block manager does); ``commit`` then
applies the step's decisions at once: preempted sequences lose their cache and go to the front of the
waiting queue, admitted ones move to the running queue (a prefix-cache hit's tokens count as computed from
then on). The engine loop is schedule -> commit -> execute -> update.
"""

from __future__ import annotations

from longctx.engine.sequence import ScheduledChunk, Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager

RUNNING, WAITING = SequenceStatus.RUNNING, SequenceStatus.WAITING
_chunk = tuple.__new__  # _chunk(ScheduledChunk, (seq, n)) is ScheduledChunk(seq, n) without its __new__ call


class ScheduledBatch:
    """What one forward pass runs: ``entries`` (``ScheduledChunk``\\ s) in the order they were added.

    Args:
        block_manager: the KV pool; ``add`` reserves slots in it.
        running: the running queue as the policy sees it, oldest first (preemption picks from its end).
        token_budget: most tokens per step (``add`` refuses more), or None for no limit.
        max_num_seqs: most sequences holding KV blocks at once, or None for no limit.
        decode_chunks: seq id -> its one-token entry, kept by the caller across steps (the engine's).
    """

    def __init__(
        self, block_manager: BlockManager, running: list[Sequence] = (), *, token_budget: int | None = None,
        max_num_seqs: int | None = None, decode_chunks: dict[int, ScheduledChunk] | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.running = running
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.entries: list[ScheduledChunk] = []
        self.preempted: list[Sequence] = []  # lost their KV cache this step, in preemption order
        self.num_tokens = 0  # tokens this step computes: what a token budget limits
        self.num_decode_tokens = 0
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache by this step's admissions
        self.prefix_cache_hits = 0  # ... and how many of them were cached
        self._ids: set[int] = set()  # seq ids in entries
        self._preempted_ids: set[int] = set()
        self._prefix_hits: dict[int, int] = {}  # seq id -> cached prompt tokens its admission took (commit)
        self._admitted: list[Sequence] = []  # waiting sequences this step admits, in entry order (commit)
        self._num_holding = len(running)  # sequences holding blocks (running - preempted + admitted)
        self._victim = len(running)  # preemption scans running from the newest end, once per step
        self._caching = block_manager.enable_prefix_caching
        # seq id -> its entry (seq, 1): the engine passes its own dict, so a decode's entry lives across steps
        self.decode_chunks: dict[int, ScheduledChunk] = {} if decode_chunks is None else decode_chunks

    # ---- what a policy reads ----
    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __contains__(self, seq: object) -> bool:
        return getattr(seq, "seq_id", None) in self._ids

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens

    @property
    def budget_left(self) -> int | None:
        """Tokens still allowed this step (None when there is no token budget)."""
        return None if self.token_budget is None else self.token_budget - self.num_tokens

    # ---- the one way in ----
    def add(self, seq: Sequence, num_tokens: int) -> bool:
        """Reserve KV slots for ``num_tokens`` more tokens of ``seq`` and append it to the batch.

        Returns False, adding nothing, when ``seq`` cannot run this step (preempted earlier in this step;
        waiting while the pool or ``max_num_seqs`` is full; running and short of blocks even after
        preempting every newer sequence, in which case it is preempted itself).
        Raises ``ValueError`` for an illegal entry: ``num_tokens`` not in ``[1, seq.num_uncomputed_tokens]``,
        a sequence already in the batch or finished, or a total over ``token_budget``.
        """
        sid = seq.seq_id
        if sid in self._preempted_ids:
            return False
        if num_tokens.__class__ is int and num_tokens == 1 and self._fits_one_more(seq):
            self._append(seq, 1, seq.num_computed_tokens)  # the hot path: a running decode, no pool change
            return True
        num_tokens = self._checked(seq, num_tokens)
        computed = seq.num_computed_tokens  # tokens before this entry's (with a prefix-cache hit, its tokens)
        if seq.status is WAITING:
            admitted = self._admit(seq, num_tokens)
            if admitted is None:
                return False
            computed, num_tokens = admitted
            self._admitted.append(seq)
        elif not self._make_room(seq, seq.num_cached_tokens + num_tokens):
            return False
        self._append(seq, num_tokens, computed)
        return True

    def add_decodes(self, seqs) -> list[Sequence]:
        """``add(seq, 1)`` for each decode of ``seqs`` (``Sequence.is_decode``) in order, while the token
        budget lasts (no budget: all); returns the others (prefills), in order. A stall-free policy's first
        loop."""
        others, budget = [], self.token_budget
        for seq in seqs:
            if not seq.is_decode:
                others.append(seq)
            elif budget is None or self.num_tokens < budget:
                self.add(seq, 1)
        return others

    def _fits_one_more(self, seq: Sequence) -> bool:
        """Whether one more token of running ``seq`` is a legal entry whose KV slot its last block already has
        (what ``_checked`` and ``_make_room`` would find, without their calls)."""
        return (seq.status is RUNNING and seq.seq_id not in self._ids and seq.num_uncomputed_tokens > 0
                and (self.token_budget is None or self.num_tokens < self.token_budget)
                and self.block_manager.has_room(seq.seq_id, seq.num_cached_tokens + 1))

    def _append(self, seq: Sequence, num_tokens: int, computed: int) -> None:
        """Append the entry ``num_tokens`` tokens of ``seq`` after its first ``computed`` (slots reserved)."""
        sid = seq.seq_id
        if self._caching:  # the blocks it fills are shareable now (same step too)
            self.block_manager.cache_full_blocks(sid, seq.token_ids, computed + num_tokens)
        if num_tokens == 1:  # a decode's entry is the same tuple every step (the engine keeps them)
            chunk = self.decode_chunks.get(sid)
            if chunk is None or chunk[0] is not seq:
                chunk = self.decode_chunks[sid] = _chunk(ScheduledChunk, (seq, 1))
        else:
            chunk = ScheduledChunk(seq, num_tokens)
        self.entries.append(chunk)
        self._ids.add(sid)
        self.num_tokens += num_tokens
        if seq.output_token_ids and seq.num_tokens - computed == 1:  # a decode: only the last output is left
            self.num_decode_tokens += 1

    def _checked(self, seq: Sequence, num_tokens) -> int:
        """``num_tokens`` as an int, or ``ValueError`` when the entry is illegal (see ``add``)."""
        sid, status, left = seq.seq_id, seq.status, seq.num_uncomputed_tokens
        if type(num_tokens) is not int:
            if isinstance(num_tokens, bool) or int(num_tokens) != num_tokens:
                raise ValueError(f"num_tokens must be an integer, got {num_tokens!r}")
            num_tokens = int(num_tokens)
        if not 1 <= num_tokens <= left:
            raise ValueError(
                f"sequence {sid} has {left} tokens left to compute: schedule 1 to {left} of them, "
                f"not {num_tokens}"
            )
        if sid in self._ids:
            raise ValueError(f"sequence {sid} is already in this batch: add each sequence once per step")
        if status is not RUNNING and status is not WAITING:
            raise ValueError(f"sequence {sid} is {status.value}: only running or waiting sequences run")
        if self.token_budget is not None and self.num_tokens + num_tokens > self.token_budget:
            raise ValueError(
                f"adding {num_tokens} tokens of sequence {sid} makes {self.num_tokens + num_tokens} tokens, "
                f"over token_budget={self.token_budget} (budget_left is {self.budget_left})"
            )
        return num_tokens

    def _admit(self, seq: Sequence, num_tokens: int) -> tuple[int, int] | None:
        """Admit waiting ``seq`` if fewer than ``max_num_seqs`` sequences hold blocks and the pool could hold
        its whole prompt, taking its prefix-cache hit first; reserve the entry's slots. Returns ``(tokens
        before the entry, tokens the entry computes)`` (the hit shortens it), or None when refused."""
        bm, sid = self.block_manager, seq.seq_id
        computed, left = seq.num_computed_tokens, seq.num_uncomputed_tokens
        if self.max_num_seqs is not None and self._num_holding >= self.max_num_seqs:
            return None
        hit = None
        wants_prompt_logits = seq.sampling is not None and seq.sampling.prompt_logprobs is not None
        if bm.enable_prefix_caching and computed == 0 and not wants_prompt_logits:  # (vLLM: no hit either)
            hit = bm.cached_prefix(seq.token_ids())
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += 0 if hit is None else hit.num_tokens
        if not bm.can_admit(sid, computed + left, hit, num_new=num_tokens):
            return None  # admit a prompt only when all of it fits: a half-done prefill rarely restarts
        self._num_holding += 1
        total = seq.num_cached_tokens + num_tokens  # KV slots it will hold
        if hit is not None:  # a prefix-cache hit: no prefill for those tokens (commit counts them computed)
            bm.take_prefix(sid, hit)
            self._prefix_hits[sid] = computed = hit.num_tokens
            num_tokens = min(num_tokens, left - computed)
            total = computed + num_tokens
        if bm.extra_blocks_needed(sid, total):
            bm.allocate(sid, total)
        return computed, num_tokens

    def _make_room(self, seq: Sequence, total: int) -> bool:
        """Blocks for running ``seq`` to hold ``total`` KV slots, preempting newer running sequences while the
        pool is short; False (``seq`` itself preempted) when none is left to give way."""
        bm = self.block_manager
        bm.release_out_of_window(seq.seq_id, seq.num_computed_tokens)  # a sliding layer's oldest blocks
        need = bm.extra_blocks_needed(seq.seq_id, total)  # usually 0 for a decode: its last block has room
        while need > bm.num_free_blocks:
            victim = self._newest_victim(seq)
            if victim is None:
                self._preempt(seq)
                return False
            self._preempt(victim)
        if need:
            bm.allocate(seq.seq_id, total)
        return True

    def _newest_victim(self, seq: Sequence) -> Sequence | None:
        """The newest running sequence, newer than ``seq``, not in the batch nor preempted (or None)."""
        while self._victim > 0:
            cand = self.running[self._victim - 1]
            if cand is seq:
                return None  # only newer sequences give way
            self._victim -= 1
            if cand.seq_id not in self._ids and cand.seq_id not in self._preempted_ids:
                return cand
        return None

    def _preempt(self, seq: Sequence) -> None:
        """Preemption by recompute: free the blocks of ``seq`` now; ``commit`` resets the sequence."""
        self.block_manager.free(seq.seq_id)
        self.preempted.append(seq)
        self._preempted_ids.add(seq.seq_id)
        self._num_holding -= 1

    # ---- applying the decisions ----
    def commit(self, running: list[Sequence], waiting: list[Sequence], now_s: float) -> None:
        """Apply the step to the engine's queues: preempted sequences restart from token 0 at the front of
        ``waiting`` (oldest first); admitted ones leave ``waiting`` for the end of ``running``, with their
        prefix-cache hit (if any) counted as computed (num_computed_tokens, num_prefix_cached_tokens)."""
        if len(self._ids) != len(self.entries):
            raise ValueError("add entries with batch.add(seq, num_tokens) only (it reserves their KV slots)")
        if self.preempted:
            gone = self._preempted_ids
            running[:] = [s for s in running if s.seq_id not in gone]
            for s in self.preempted:
                s.status = WAITING
                s.num_computed_tokens = s.num_evicted_tokens = 0
                s.num_preemptions += 1
            waiting[:0] = sorted(self.preempted, key=lambda s: (s.arrival_s, s.seq_id))
        for seq in self._admitted:  # not every entry: a step's admissions are few, its decodes many
            waiting.remove(seq)
            running.append(seq)
            seq.status = RUNNING
            if seq.seq_id in self._prefix_hits:
                seq.num_computed_tokens = seq.num_prefix_cached_tokens = self._prefix_hits[seq.seq_id]
            if seq.first_scheduled_s is None:
                seq.first_scheduled_s = now_s

    def __repr__(self) -> str:
        body = ", ".join(f"{e.seq.seq_id}:{e.num_tokens}" for e in self.entries)
        return f"ScheduledBatch([{body}], preempted={[s.seq_id for s in self.preempted]})"
