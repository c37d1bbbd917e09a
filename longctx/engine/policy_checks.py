"""Check that a scheduling policy is stall-free, on toy workloads with a virtual clock.

Lesson 02's exercise asks the learner to write ``schedule`` for a token-budget scheduler in
Sarathi-Serve's stall-free order. These checks run the learner's policy in the real ``Engine`` (with a
``ToyExecutor`` and a ``VirtualClock``: no model, milliseconds per run) and inspect every decision it
made. Each rule has a message that says which step broke it and how:

1. the token budget is never exceeded;
2. running decodes go first: a step that prefills leaves no running decode out (unless the decodes
   alone fill the budget);
3. prefills already in progress come before new prompts;
4. the budget is filled while there is prefill work that could use it;
5. every request finishes (nobody starves, nothing hangs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from longctx.engine.clock import VirtualClock
from longctx.engine.engine import Engine
from longctx.engine.executor import ToyExecutor
from longctx.engine.scheduler import ScheduledBatch, Scheduler


@dataclass(frozen=True)
class Decision:
    """What the policy saw and chose at one step (sequence ids and token counts)."""

    step: int
    decoding: tuple[int, ...]  # running, prompt fully computed: want 1 token
    in_progress: dict[int, int]  # running, prompt partly computed: id -> tokens left
    new: dict[int, int]  # waiting: id -> tokens left
    chosen: dict[int, int]  # id -> tokens scheduled
    preempted: int


class RecordingScheduler(Scheduler):
    """Wraps a policy and records each decision; behaves exactly like the wrapped policy."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.token_budget = getattr(inner, "token_budget", None)
        self.max_num_seqs = getattr(inner, "max_num_seqs", Scheduler.max_num_seqs)
        self.decisions: list[Decision] = []

    def schedule(self, running, waiting, block_manager) -> ScheduledBatch:
        decoding = tuple(s.seq_id for s in running if s.is_decode)
        in_progress = {s.seq_id: s.num_uncomputed_tokens for s in running if not s.is_decode}
        new = {s.seq_id: s.num_uncomputed_tokens for s in waiting}
        batch = self.inner.schedule(running, waiting, block_manager)
        if not isinstance(batch, ScheduledBatch):
            raise AssertionError(f"schedule must return a ScheduledBatch, got {type(batch).__name__}")
        chosen = {e.seq.seq_id: e.num_tokens for e in batch.entries}
        self.decisions.append(
            Decision(len(self.decisions), decoding, in_progress, new, chosen, len(batch.preempted))
        )
        return batch


@dataclass(frozen=True)
class ToyRequest:
    prompt_tokens: int
    max_tokens: int
    arrival_s: float


def chat_plus_long_prompts(
    num_streams: int = 4, long_prompts: tuple[int, ...] = (600,), stream_tokens: int = 40
) -> list[ToyRequest]:
    """``num_streams`` short chats decoding from t=0, then long prompts arriving while they decode."""
    chats = [ToyRequest(8, stream_tokens, 0.0) for _ in range(num_streams)]
    return chats + [ToyRequest(p, 4, 0.1 + 0.01 * i) for i, p in enumerate(long_prompts)]


def random_workload(num_requests: int, seed: int) -> list[ToyRequest]:
    """Seeded mixed workload: prompt lengths 1..400, outputs 1..30, arrivals spread over 0.5 s."""
    rng = random.Random(seed)
    return [
        ToyRequest(rng.randint(1, 400), rng.randint(1, 30), rng.uniform(0, 0.5)) for _ in range(num_requests)
    ]


def run_policy(
    scheduler: Scheduler,
    workload: list[ToyRequest],
    num_blocks: int = 4096,
    block_size: int = 16,
    max_steps: int = 20_000,
) -> tuple[Engine, RecordingScheduler]:
    """Run ``workload`` through the real engine with ``scheduler``; returns the engine and the recording."""
    recorder = RecordingScheduler(scheduler)
    engine = Engine(
        ToyExecutor(), recorder, num_blocks=num_blocks, block_size=block_size, clock=VirtualClock()
    )
    for r in workload:
        engine.add_request(
            list(range(1, r.prompt_tokens + 1)), max_tokens=r.max_tokens, arrival_s=r.arrival_s
        )
    try:
        engine.run_until_done(max_steps=max_steps)
    except RuntimeError as exc:  # the engine's own contract checks, or no progress
        message = str(exc).replace(type(recorder).__name__, type(scheduler).__name__)
        raise AssertionError(f"the engine stopped your policy: {message}") from None
    return engine, recorder


def check_stall_free(
    scheduler: Scheduler, workload: list[ToyRequest], *, check_fill: bool = True, **engine_kwargs
) -> Engine:
    """Run ``scheduler`` on ``workload`` and assert the five rules above; returns the engine."""
    budget = scheduler.token_budget
    if budget is None:
        raise AssertionError("a token-budget scheduler must set self.token_budget to a positive integer")
    engine, recorder = run_policy(scheduler, workload, **engine_kwargs)
    for d in recorder.decisions:
        total = sum(d.chosen.values())
        where = (
            f"step {d.step} (decoding {len(d.decoding)}, prefills in progress {len(d.in_progress)}, "
            f"new {len(d.new)}; you scheduled {d.chosen})"
        )
        if total > budget:
            raise AssertionError(f"{where}: {total} tokens exceed token_budget={budget}")
        if d.preempted:
            continue  # memory pressure: the order rules do not apply to a step that had to preempt
        prefilled = any(i not in d.decoding for i in d.chosen)
        decodes_done = sum(1 for i in d.decoding if i in d.chosen)
        if prefilled and decodes_done < min(len(d.decoding), budget):
            raise AssertionError(
                f"{where}: a prefill ran while {len(d.decoding) - decodes_done} running decodes "
                "were left out. Schedule every running decode first (1 token each)."
            )
        if any(i in d.new for i in d.chosen):
            short = [i for i, left in d.in_progress.items() if d.chosen.get(i, 0) < left]
            if short:
                raise AssertionError(
                    f"{where}: a new prompt started while prefill(s) {short} already in "
                    "progress did not get all their remaining tokens. Continue them first."
                )
        if check_fill and total < budget:
            unserved_in_progress = any(d.chosen.get(i, 0) < left for i, left in d.in_progress.items())
            unserved_new = any(d.chosen.get(i, 0) < left for i, left in d.new.items())
            if unserved_in_progress or unserved_new:
                raise AssertionError(
                    f"{where}: only {total} of {budget} budget tokens used while prompt "
                    "tokens were waiting. Chunk the prefills to fill the budget."
                )
    unfinished = [s.seq_id for s in engine.sequences if not s.is_finished]
    if unfinished:
        raise AssertionError(f"requests {unfinished} never finished")
    return engine
