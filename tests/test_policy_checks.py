"""The stall-free checks that grade lesson 02's scheduler exercise accept the reference policy and
reject each classic mistake with a message naming the broken rule; decisions cross as plain data."""

from __future__ import annotations

import json

import pytest

from longctx.engine import (
    ChunkedPrefillScheduler,
    MonolithicScheduler,
    PrefillFirstChunkedScheduler,
    Scheduler,
    Sequence,
    SequenceStatus,
)
from longctx.kv.block_manager import BlockManager
from longctx.lessons.policy_checks import (
    chat_plus_long_prompts,
    check_stall_free,
    decide,
    random_workload,
    scheduler_state,
)


class StallFree(Scheduler):
    """A learner's own stall-free policy (what lesson 02's solution writes)."""

    def __init__(self, token_budget):
        self.token_budget = token_budget

    def schedule(self, running, waiting, batch):
        for seq in running:
            if seq.is_decode and batch.budget_left > 0:
                batch.add(seq, 1)
        for seq in running:
            if seq.is_prefill and batch.budget_left > 0:
                batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left))
        for seq in waiting:
            if batch.budget_left == 0 or not batch.add(
                seq, min(seq.num_uncomputed_tokens, batch.budget_left)
            ):
                break


@pytest.mark.parametrize("budget", [1, 4, 32, 64, 512])
def test_own_and_reference_policies_pass_every_workload(budget):
    for policy, allow in ((StallFree(budget), False), (ChunkedPrefillScheduler(budget), True)):
        check_stall_free(policy, chat_plus_long_prompts(), allow_library=allow)
        check_stall_free(policy, chat_plus_long_prompts(6, (300, 500)), allow_library=allow)
        for seed in range(3):
            check_stall_free(policy, random_workload(20, seed), allow_library=allow)


def test_policy_passes_under_memory_pressure():
    engine = check_stall_free(StallFree(32), random_workload(20, 0), num_blocks=40, check_fill=False)
    assert any(r.num_preempted for r in engine.history), "the small pool was meant to force preemption"


def test_state_and_decisions_are_plain_data_and_replay_exactly():
    bm = BlockManager(8, 4)
    run = Sequence(0, [1] * 6, max_tokens=5)
    run.status, run.num_computed_tokens, run.output_token_ids = SequenceStatus.RUNNING, 7, [3, 4]
    bm.allocate(0, 7)
    wait = Sequence(1, [1] * 30, max_tokens=2)
    state = scheduler_state([run], [wait], bm)
    assert json.loads(json.dumps(state)) == state  # nothing but plain data
    calls = decide(StallFree(16), state)
    assert calls == [[0, 1], [1, 15]]
    assert json.loads(json.dumps(calls)) == calls
    assert bm.block_table(0) == [0, 1]  # the mirror's block manager is a copy: nothing reserved here


class RemoteProxy:
    """What the grader holds: an object with decide(state) (here it calls decide through JSON)."""

    def __init__(self, policy):
        self.policy = policy

    def decide(self, state):
        return json.loads(json.dumps(decide(self.policy, json.loads(json.dumps(state)))))


def test_check_accepts_a_remote_decider():
    check_stall_free(RemoteProxy(StallFree(64)), chat_plus_long_prompts(), token_budget=64)


class Liar:
    def __init__(self, calls):
        self.calls = calls

    def decide(self, state):
        return self.calls(state)


@pytest.mark.parametrize(
    ("calls", "message"),
    [
        (lambda s: [[999, 1]], "neither running nor waiting"),
        (lambda s: [[s["waiting"][0]["seq_id"], 10**6]] if s["waiting"] else [], "tokens left"),
        (lambda s: [], "empty"), (lambda s: "no", "list of"),
        (lambda s: [[w["seq_id"], w["num_prompt_tokens"]] for w in s["waiting"]], "over token_budget"),
    ],
)
def test_bad_remote_decisions_are_named(calls, message):
    with pytest.raises(AssertionError, match=message):
        check_stall_free(Liar(calls), chat_plus_long_prompts(), token_budget=8)


class Delegating(Scheduler):
    def __init__(self, token_budget):
        self.token_budget = token_budget
        self.inner = ChunkedPrefillScheduler(token_budget)

    def schedule(self, running, waiting, batch):
        self.inner.schedule(running, waiting, batch)


class Inheriting(ChunkedPrefillScheduler):
    pass


@pytest.mark.parametrize("policy", [Delegating(64), Inheriting(64)])
def test_delegating_to_the_library_policy_is_refused(policy):
    with pytest.raises(AssertionError, match="write the three loops yourself"):
        check_stall_free(policy, chat_plus_long_prompts())


class NewFirst(Scheduler):
    """Budgeted, but new prompts before decodes: the stall in disguise."""

    def __init__(self, token_budget):
        self.token_budget = token_budget

    def schedule(self, running, waiting, batch):
        for seq in [s for s in running if not s.is_decode] + waiting + [s for s in running if s.is_decode]:
            n = 1 if seq.is_decode else min(seq.num_uncomputed_tokens, batch.budget_left)
            if batch.budget_left >= n > 0:
                batch.add(seq, n)


class NewBeforeInProgress(StallFree):
    def schedule(self, running, waiting, batch):
        for seq in running:
            if seq.is_decode and batch.budget_left:
                batch.add(seq, 1)
        for seq in waiting + [s for s in running if s.is_prefill]:
            n = min(seq.num_uncomputed_tokens, batch.budget_left)
            if n:
                batch.add(seq, n)


class OnePrefillPerStep(StallFree):
    """Decodes first, then a chunk of ONE prompt per step: the rest of the budget sits idle."""

    def schedule(self, running, waiting, batch):
        for seq in running:
            if seq.is_decode and batch.budget_left:
                batch.add(seq, 1)
        for seq in [s for s in running if s.is_prefill] + waiting:
            n = min(seq.num_uncomputed_tokens, batch.budget_left)
            if n and batch.add(seq, n):
                break


class DecodesLast(StallFree):
    """Every decode gets its token, but listed after the prefills."""

    def schedule(self, running, waiting, batch):
        decodes = [s for s in running if s.is_decode]
        budget = self.token_budget - len(decodes)
        for seq in [s for s in running if s.is_prefill] + waiting:
            n = min(seq.num_uncomputed_tokens, budget)
            if n > 0 and batch.add(seq, n):
                budget -= n
        for seq in decodes:
            batch.add(seq, 1)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (NewFirst(64), "running decodes"), (NewBeforeInProgress(64), "already in progress"),
        (OnePrefillPerStep(64), "fill the budget"), (DecodesLast(64), "Sarathi-Serve's order"),
        (PrefillFirstChunkedScheduler(64), "running decodes"), (MonolithicScheduler(), "token_budget"),
    ],
)
def test_each_classic_mistake_is_named(policy, message):
    with pytest.raises(AssertionError, match=message):
        check_stall_free(policy, chat_plus_long_prompts(6, (300, 500)), allow_library=True)


def test_a_policy_without_a_budget_is_refused():
    class Unbudgeted(StallFree):
        token_budget = None

        def __init__(self):
            pass

    with pytest.raises(AssertionError, match="token_budget"):
        check_stall_free(Unbudgeted(), chat_plus_long_prompts())


def test_an_unwritten_policy_shows_the_stub_not_an_empty_engine_message():
    """NotImplementedError is a RuntimeError: it must not turn into "the engine stopped your policy: " with
    nothing after it (what the learner's lesson 02 showed before its exercise was written)."""

    class Unwritten(Scheduler):
        token_budget = 64

        def schedule(self, running, waiting, batch):
            raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check_stall_free(Unwritten(), chat_plus_long_prompts())
