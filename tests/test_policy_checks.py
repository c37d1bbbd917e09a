"""The stall-free checks that grade lesson 02's scheduler exercise accept the reference policy and
reject each classic mistake with a message naming the broken rule."""

from __future__ import annotations

import pytest

from longctx.engine import ChunkedPrefillScheduler, ScheduledBatch, Scheduler
from longctx.engine.policy_checks import chat_plus_long_prompts, check_stall_free, random_workload


@pytest.mark.parametrize("budget", [1, 4, 32, 64, 512])
def test_reference_policy_passes_every_workload(budget):
    check_stall_free(ChunkedPrefillScheduler(budget), chat_plus_long_prompts())
    check_stall_free(ChunkedPrefillScheduler(budget), chat_plus_long_prompts(6, (300, 500)))
    for seed in range(3):
        check_stall_free(ChunkedPrefillScheduler(budget), random_workload(20, seed))


def test_reference_policy_passes_under_memory_pressure():
    engine = check_stall_free(ChunkedPrefillScheduler(32), random_workload(20, 1), num_blocks=40, check_fill=False)
    assert any(r.num_preempted for r in engine.history), "the small pool was meant to force preemption"


class PrefillFirst(Scheduler):
    """Budgeted, but new prompts before decodes: the stall in disguise."""

    def __init__(self, token_budget):
        self.token_budget = token_budget

    def schedule(self, running, waiting, block_manager):
        batch, budget = ScheduledBatch(), self.token_budget
        for seq in [s for s in running if not s.is_decode] + waiting + [s for s in running if s.is_decode]:
            n = 1 if seq.is_decode else min(seq.num_uncomputed_tokens, budget)
            if budget >= n > 0 and self.reserve(batch, seq, n, running, block_manager):
                budget -= n
        return batch


class NewBeforeInProgress(ChunkedPrefillScheduler):
    def schedule(self, running, waiting, block_manager):
        batch, budget = ScheduledBatch(), self.token_budget
        for seq in running:
            if seq.is_decode and budget and self.reserve(batch, seq, 1, running, block_manager):
                budget -= 1
        for seq in waiting + [s for s in running if s.is_prefill]:
            n = min(seq.num_uncomputed_tokens, budget)
            if n and self.reserve(batch, seq, n, running, block_manager):
                budget -= n
        return batch


class OnePrefillPerStep(ChunkedPrefillScheduler):
    """Decodes first, then a chunk of ONE prompt per step: the rest of the budget sits idle."""

    def schedule(self, running, waiting, block_manager):
        batch, budget = ScheduledBatch(), self.token_budget
        for seq in running:
            if seq.is_decode and budget and self.reserve(batch, seq, 1, running, block_manager):
                budget -= 1
        for seq in [s for s in running if s.is_prefill] + waiting:
            n = min(seq.num_uncomputed_tokens, budget)
            if n and self.reserve(batch, seq, n, running, block_manager):
                break
        return batch


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (PrefillFirst(64), "running decodes"),
        (NewBeforeInProgress(64), "already in progress"),
        (OnePrefillPerStep(64), "fill the budget"),
    ],
)
def test_each_classic_mistake_is_named(policy, message):
    with pytest.raises(AssertionError, match=message):
        check_stall_free(policy, chat_plus_long_prompts(6, (300, 500)))


def test_a_policy_without_a_budget_is_refused():
    class Unbudgeted(ChunkedPrefillScheduler):
        token_budget = None

        def __init__(self):
            pass

    with pytest.raises(AssertionError, match="token_budget"):
        check_stall_free(Unbudgeted(), chat_plus_long_prompts())
