"""Schedulers: each iteration, which sequences advance and by how many tokens.

A policy writes one method, ``schedule(running, waiting, batch)``, and adds entries with
``batch.add(seq, num_tokens) -> bool`` (``longctx.engine.batch``: it reserves the KV slots, admits and
preempts). It sees sequence lengths and the block manager, never tensors, so the same policy drives the
real model (``TorchExecutor``) and the simulator (a cost-model executor).

Three policies ship here:

- ``MonolithicScheduler``: prefill-first, whole prompts at once (vLLM V0's default, nano-vllm). While a
  prompt is prefilled every decoding stream waits: a long prompt *stalls* them (decode starvation).
- ``PrefillFirstChunkedScheduler``: prompts cut into chunks of at most ``token_budget`` tokens, but a
  step is prefill *or* decode, prefills first (mini-SGLang's default). Chunking alone does not remove the
  stall: decodes still wait until every queued prompt is prefilled, one chunk per step.
- ``ChunkedPrefillScheduler``: a token budget per step filled in Sarathi-Serve's stall-free order
  (Agrawal et al., OSDI 2024): running decodes first, then prefills already in progress, then new
  prefills, chunked to fill what is left of the budget.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from longctx.checks import positive_int
from longctx.engine.batch import ScheduledBatch
from longctx.engine.sequence import Sequence

DEFAULT_MAX_NUM_SEQS = 256


class Scheduler(ABC):
    """Base class of scheduling policies. Subclasses write ``schedule`` only.

    Attributes the engine reads when it makes each step's batch: ``token_budget`` (max tokens per step,
    or None for no limit) and ``max_num_seqs`` (max sequences holding KV blocks at once).
    """

    token_budget: int | None = None
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS

    @abstractmethod
    def schedule(self, running: list[Sequence], waiting: list[Sequence], batch: ScheduledBatch) -> None:
        """Fill ``batch`` with the sequences that advance this step, via ``batch.add(seq, num_tokens)``.

        Args:
            running: sequences holding KV blocks (started prefills and decodes), oldest first.
            waiting: sequences that have arrived and hold no blocks (new, or preempted), in queue order.
            batch: the step's batch; ``batch.budget_left`` says how many tokens may still be added.

        The engine raises if the batch stays empty while there is work (it would never finish).
        Stall-free policies put running decodes first and in-progress prefills before new ones.
        """


class MonolithicScheduler(Scheduler):
    """Prefill-first without chunking (vLLM V0's default, nano-vllm).

    If any waiting prompt fits, the step prefills whole prompts only (as many as fit in
    ``max_num_batched_tokens``; the first one always goes, however long); otherwise every running
    sequence decodes one token. Decodes stall for the whole duration of a long prefill.
    """

    def __init__(self, max_num_batched_tokens: int | None = None, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS):
        positive_int("max_num_batched_tokens", max_num_batched_tokens, allow_none=True)
        positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs

    def schedule(self, running, waiting, batch):
        limit = self.max_num_batched_tokens
        for seq in waiting:  # 1. whole prompts, oldest first
            n = seq.num_uncomputed_tokens
            if batch and limit is not None and batch.num_tokens + n > limit:
                break
            if not batch.add(seq, n):
                break
        if batch:
            return  # a prefill-only step: every decode waits (the stall)
        for seq in running:  # 2. otherwise one token for every running sequence
            batch.add(seq, 1)

    def __repr__(self) -> str:
        return f"MonolithicScheduler(max_num_batched_tokens={self.max_num_batched_tokens})"


class TokenBudgetScheduler(Scheduler):
    """A policy with a token budget per step (chunked prefill): the one constructor of the two below."""

    def __init__(self, token_budget: int = 512, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> None:
        self.token_budget = positive_int("token_budget", token_budget)
        positive_int("max_num_seqs", max_num_seqs)
        self.max_num_seqs = max_num_seqs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(token_budget={self.token_budget})"


class PrefillFirstChunkedScheduler(TokenBudgetScheduler):
    """Chunked prefill with a token budget, but a step is prefill OR decode, prefill first (mini-SGLang).

    While any prompt has tokens left, the step prefills chunks (in-progress prompts first, then new ones)
    up to ``token_budget`` tokens; only a step with no prefill work decodes every running sequence. Each
    prefill step is short, yet decodes still wait for *all* queued prompt tokens: the stall is split into
    ``ceil(prompt / token_budget)`` steps, not removed.
    """

    def schedule(self, running, waiting, batch):
        for seq in running:  # 1. prefills in progress
            if batch.budget_left and not seq.is_decode:
                batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left))
        for seq in waiting:  # 2. new prompts, chunked to fill the budget
            if not batch.budget_left or not batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left)):
                break
        if batch:
            return  # a prefill step: decodes wait
        for seq in running:  # 3. no prefill work: a decode step, within the budget
            if batch.budget_left:
                batch.add(seq, 1)


class ChunkedPrefillScheduler(TokenBudgetScheduler):
    """Chunked prefill with a token budget, in Sarathi-Serve's stall-free order.

    Each step computes at most ``token_budget`` tokens: (1) one token for every running decode, (2) the
    next chunk of prefills already in progress, (3) new prefills, the last one chunked to fill the budget.
    A decode therefore waits for at most one step of ``token_budget`` tokens, never for a whole prompt.
    """

    def schedule(self, running, waiting, batch):
        in_progress = batch.add_decodes(running)  # 1. running decodes first: they never stall
        for seq in in_progress:  # 2. prefills already in progress
            if batch.budget_left:
                batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left))
        for seq in waiting:  # 3. new prefills, chunked to fill the budget
            if not batch.budget_left or not batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left)):
                break
