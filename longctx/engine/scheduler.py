"""Schedulers: each iteration, which sequences advance and by how many tokens.

A scheduler writes one method, ``schedule(running, waiting, block_manager) -> ScheduledBatch``. It sees
sequence lengths and the block manager, never tensors, so the same policy drives the real model
(``TorchExecutor``) and the simulator (a cost-model executor).

Two policies ship here:

- ``MonolithicScheduler``: prefill-first, whole prompts at once (vLLM V0's default, nano-vllm). While a
  prompt is prefilled every decoding stream waits: a long prompt *stalls* them (decode starvation).
- ``ChunkedPrefillScheduler``: a token budget per step filled in Sarathi-Serve's stall-free order
  (Agrawal et al., OSDI 2024): running decodes first, then prefills already in progress, then new
  prefills, chunked to fill what is left of the budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

from longctx.engine.sequence import Sequence, SequenceStatus
from longctx.kv.block_manager import BlockManager


class ScheduledChunk(NamedTuple):
    """One entry of a batch: advance ``seq`` by ``num_tokens`` tokens (1 for a decode, n for a prefill chunk).

    Properties describe the sequence *before* the step runs (the executor reads them then).
    """

    seq: Sequence
    num_tokens: int

    @property
    def context_len(self) -> int:
        """Tokens already in the KV cache that this chunk attends to (besides itself)."""
        return self.seq.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        return self.seq.is_decode

    @property
    def completes_prefill(self) -> bool:
        """True when this chunk reaches the end of the sequence, so the step samples a token for it."""
        return self.num_tokens == self.seq.num_uncomputed_tokens


@dataclass
class ScheduledBatch:
    """What one forward pass runs. ``entries`` mixes decodes (1 token) and prefill chunks (n tokens).

    ``preempted`` lists sequences whose KV cache was thrown away this step (they go back to the front of
    the waiting queue and are recomputed later). ``block_tables`` (seq_id -> block ids) is filled in by the
    engine before the executor runs.
    """

    entries: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_tables: dict[int, list[int]] = field(default_factory=dict)
    _added: set = field(default_factory=set, init=False, repr=False, compare=False)  # sequences via add()

    def add(self, seq: Sequence, num_tokens: int) -> None:
        self.entries.append(ScheduledChunk(seq, int(num_tokens)))
        self._added.add(seq)

    def __contains__(self, seq: object) -> bool:
        if len(self._added) == len(self.entries):  # every entry came through add(): O(1)
            return seq in self._added
        return any(e.seq is seq for e in self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def num_tokens(self) -> int:
        """Tokens this step computes: what a token budget limits."""
        return sum(e.num_tokens for e in self.entries)

    @property
    def num_decode_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries if e.is_decode)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(e.num_tokens for e in self.entries if not e.is_decode)


class Scheduler(ABC):
    """Base class of scheduling policies. Subclasses write ``schedule`` only.

    Attributes the engine reads: ``token_budget`` (max tokens per step, or None for no limit) and
    ``max_num_seqs`` (max sequences holding KV blocks at once).
    """

    token_budget: int | None = None
    max_num_seqs: int = 256

    @abstractmethod
    def schedule(
        self, running: list[Sequence], waiting: list[Sequence], block_manager: BlockManager
    ) -> ScheduledBatch:
        """Pick the sequences that advance this step and by how many tokens.

        Args:
            running: sequences holding KV blocks (started prefills and decodes), oldest first.
            waiting: sequences that have arrived and hold no blocks (new, or preempted), in queue order.
            block_manager: the KV pool; read it, and reserve slots only through ``self.reserve``.

        Returns:
            a ``ScheduledBatch``. The contract the engine checks:
            - every entry was added by ``self.reserve`` (so its KV slots are reserved), at most once per
              sequence, with ``1 <= num_tokens <= seq.num_uncomputed_tokens``;
            - ``batch.num_tokens <= self.token_budget`` when a budget is set;
            - the batch is not empty while there is work (an empty batch would hang the engine).
            Stall-free policies also put running decodes first and in-progress prefills before new ones.
        """

    # ---- helpers a policy calls ----
    def reserve(
        self,
        batch: ScheduledBatch,
        seq: Sequence,
        num_tokens: int,
        running: list[Sequence],
        block_manager: BlockManager,
    ) -> bool:
        """Reserve KV slots for ``num_tokens`` more tokens of ``seq`` and add it to ``batch``.

        Returns False, and adds nothing, when the sequence cannot run this step:
        - it was preempted earlier in this step, or is already in the batch;
        - it is waiting and the pool lacks blocks or ``max_num_seqs`` sequences already run;
        - it is running and the pool lacks blocks even after preempting every running sequence that is
          newer than it and not in the batch yet (newest first, vLLM's recompute policy); then it is
          preempted itself.
        """
        if seq in batch or seq in batch.preempted or seq.status is SequenceStatus.FINISHED:
            return False
        if seq.status is SequenceStatus.WAITING:
            active = sum(s.status is SequenceStatus.RUNNING for s in running)
            admitted = sum(e.seq.status is SequenceStatus.WAITING for e in batch.entries)
            if active + admitted >= self.max_num_seqs:
                return False
            if not block_manager.can_allocate(seq.seq_id, num_tokens):
                return False
        else:
            while not block_manager.can_allocate(seq.seq_id, num_tokens):
                victims = [
                    s
                    for s in running
                    if s is not seq and s.status is SequenceStatus.RUNNING and s not in batch
                ]
                if not victims:
                    self.preempt(seq, batch, block_manager)
                    return False
                self.preempt(victims[-1], batch, block_manager)
        block_manager.allocate(seq.seq_id, num_tokens)
        batch.add(seq, num_tokens)
        return True

    @staticmethod
    def preempt(seq: Sequence, batch: ScheduledBatch, block_manager: BlockManager) -> None:
        """Preempt by recompute: free the blocks of ``seq``; it will be prefilled again from token 0."""
        block_manager.free(seq.seq_id)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        batch.preempted.append(seq)


class MonolithicScheduler(Scheduler):
    """Prefill-first without chunking (vLLM V0's default, nano-vllm).

    If any waiting prompt fits, the step prefills whole prompts only (as many as fit in
    ``max_num_batched_tokens``; the first one always goes, however long); otherwise every running
    sequence decodes one token. Decodes stall for the whole duration of a long prefill.
    """

    def __init__(self, max_num_batched_tokens: int | None = None, max_num_seqs: int = 256) -> None:
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1 or None, got {max_num_batched_tokens}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def schedule(self, running, waiting, block_manager):
        batch = ScheduledBatch()
        limit = self.max_num_batched_tokens
        for seq in waiting:  # 1. whole prompts, oldest first
            n = seq.num_uncomputed_tokens
            if batch and limit is not None and batch.num_tokens + n > limit:
                break
            if not self.reserve(batch, seq, n, running, block_manager):
                break
        if batch:
            return batch  # a prefill-only step: every decode waits (the stall)
        for seq in running:  # 2. otherwise one token for every running sequence
            self.reserve(batch, seq, 1, running, block_manager)
        return batch

    def __repr__(self) -> str:
        return f"MonolithicScheduler(max_num_batched_tokens={self.max_num_batched_tokens})"


class ChunkedPrefillScheduler(Scheduler):
    """Chunked prefill with a token budget, in Sarathi-Serve's stall-free order.

    Each step computes at most ``token_budget`` tokens: (1) one token for every running decode, (2) the
    next chunk of prefills already in progress, (3) new prefills, the last one chunked to fill the budget.
    A decode therefore waits for at most one step of ``token_budget`` tokens, never for a whole prompt.
    """

    def __init__(self, token_budget: int = 512, max_num_seqs: int = 256) -> None:
        if int(token_budget) != token_budget or token_budget < 1:
            raise ValueError(f"token_budget must be a positive integer, got {token_budget!r}")
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.token_budget = int(token_budget)
        self.max_num_seqs = max_num_seqs

    def schedule(self, running, waiting, block_manager):
        batch = ScheduledBatch()
        budget = self.token_budget
        for seq in running:  # 1. running decodes first: they never stall
            if seq.is_decode and budget > 0 and self.reserve(batch, seq, 1, running, block_manager):
                budget -= 1
        for seq in running:  # 2. prefills already in progress
            if seq.is_prefill and budget > 0:
                n = min(seq.num_uncomputed_tokens, budget)
                if self.reserve(batch, seq, n, running, block_manager):
                    budget -= n
        for seq in waiting:  # 3. new prefills, chunked to fill the budget
            if budget == 0:
                break
            n = min(seq.num_uncomputed_tokens, budget)
            if not self.reserve(batch, seq, n, running, block_manager):
                break
            budget -= n
        return batch

    def __repr__(self) -> str:
        return f"ChunkedPrefillScheduler(token_budget={self.token_budget})"
