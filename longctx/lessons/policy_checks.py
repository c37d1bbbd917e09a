"""Check that a scheduling policy is stall-free, on toy workloads with a virtual clock.

Lesson 02's exercise asks the learner to write ``schedule`` for a token-budget scheduler in
Sarathi-Serve's stall-free order. The check runs the policy's decisions in the real ``Engine`` (with a
``ToyExecutor`` and a ``VirtualClock``: no model, milliseconds per run) and inspects every step.

The policy and the check talk in plain data only (``longctx.lessons.policy_state``: ``scheduler_state``
and ``decide``), so that the check can run in another process than the learner's code (the grader's
pristine checker). ``check_stall_free(policy, workload)``: ``policy`` is a ``Scheduler`` (decided here
through ``decide``) or any object with ``decide(state) -> list`` (e.g. a proxy to another process). The
engine applies each step's decisions through the library's own batch, which validates them.

Rules, each with a message that says which step broke it and how:

1. every decision is legal (a known sequence, ``1 <= num_tokens <= tokens left``, once per step), the
   token budget is never exceeded and a step is never empty while there is work;
2. running decodes go first: a step that prefills leaves no running decode out (unless the decodes
   alone fill the budget), and the batch lists decodes, then prefills in progress, then new prompts;
3. prefills already in progress come before new prompts;
4. the budget is filled while there is prefill work that could use it;
5. every request finishes (nobody starves, nothing hangs);
6. the policy is the learner's own: decisions taken inside the library's ``ChunkedPrefillScheduler``
   (inherited or called) are refused.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from longctx.engine.clock import VirtualClock
from longctx.engine.engine import Engine
from longctx.engine.executor import ToyExecutor
from longctx.engine.scheduler import DEFAULT_MAX_NUM_SEQS, Scheduler
from longctx.lessons.policy_state import decide, scheduler_state
from longctx.sim.workload import Request

__all__ = ["Decision", "ReplayScheduler", "chat_plus_long_prompts", "check_stall_free", "decide",
           "random_workload", "run_policy", "scheduler_state"]


# ---- running decisions through the real engine ----------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the policy saw and chose at one step (sequence ids and token counts)."""

    step: int
    decoding: tuple[int, ...]  # running, prompt fully computed: want 1 token
    in_progress: dict[int, int]  # running, prompt partly computed: id -> tokens left
    new: dict[int, int]  # waiting: id -> tokens left
    chosen: dict[int, int]  # id -> tokens scheduled, in batch order
    preempted: int


class ReplayScheduler(Scheduler):
    """Asks ``decider(state)`` for each step's ``add`` calls and applies them through the batch."""

    def __init__(self, decider, token_budget: int | None, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS):
        self.decider, self.token_budget, self.max_num_seqs = decider, token_budget, max_num_seqs
        self.decisions: list[Decision] = []

    def schedule(self, running, waiting, batch):
        step = len(self.decisions)
        calls = self.decider(scheduler_state(running, waiting, batch.block_manager))
        by_id = {s.seq_id: s for s in running + waiting}
        if not isinstance(calls, (list, tuple)):
            raise AssertionError(
                f"step {step}: decisions must be a list of [seq_id, num_tokens], got {calls!r}"
            )
        for call in calls:
            if not (isinstance(call, (list, tuple)) and len(call) == 2):
                raise AssertionError(f"step {step}: each decision must be [seq_id, num_tokens], got {call!r}")
            seq_id, n = call
            if isinstance(seq_id, bool) or not isinstance(seq_id, int) or seq_id not in by_id:
                raise AssertionError(f"step {step}: sequence {seq_id!r} is neither running nor waiting")
            try:
                batch.add(by_id[seq_id], n)
            except ValueError as exc:
                raise AssertionError(f"step {step}: {exc}") from None
        self.decisions.append(
            Decision(
                step,
                tuple(s.seq_id for s in running if s.is_decode),
                {s.seq_id: s.num_uncomputed_tokens for s in running if not s.is_decode},
                {s.seq_id: s.num_uncomputed_tokens for s in waiting},
                {e.seq.seq_id: e.num_tokens for e in batch.entries},
                len(batch.preempted),
            )
        )


def chat_plus_long_prompts(
    num_streams: int = 4, long_prompts: tuple[int, ...] = (600,), stream_tokens: int = 40
) -> list[Request]:
    """``num_streams`` short chats decoding from t=0, then long prompts arriving while they decode."""
    chats = [Request(0.0, 8, stream_tokens) for _ in range(num_streams)]
    return chats + [Request(0.1 + 0.01 * i, p, 4) for i, p in enumerate(long_prompts)]


def _toy(prompt_tokens: int, output_tokens: int, arrival_s: float) -> Request:  # the draws' order, kept
    return Request(arrival_s, prompt_tokens, output_tokens)


def random_workload(num_requests: int, seed: int) -> list[Request]:
    """Seeded mixed workload: prompt lengths 1..400, outputs 1..30, arrivals spread over 0.5 s."""
    rng = random.Random(seed)
    return [
        _toy(rng.randint(1, 400), rng.randint(1, 30), rng.uniform(0, 0.5)) for _ in range(num_requests)
    ]


def _decider(policy, allow_library: bool):
    if isinstance(policy, Scheduler):
        return lambda state: decide(policy, state, allow_library=allow_library)
    if callable(getattr(policy, "decide", None)):
        return policy.decide
    raise AssertionError(
        "expected a Scheduler subclass instance (or an object with decide(state)), "
        f"got {type(policy).__name__}"
    )


def run_policy(
    scheduler,
    workload: list[Request],
    num_blocks: int = 4096,
    block_size: int = 16,
    max_steps: int = 20_000,
    *,
    allow_library: bool = True,
    token_budget: int | None = None,
) -> tuple[Engine, ReplayScheduler]:
    """Run ``workload`` through the real engine with the policy's decisions; returns the engine and the
    replaying scheduler (``.decisions``: one ``Decision`` per step)."""
    budget = token_budget if token_budget is not None else getattr(scheduler, "token_budget", None)
    replay = ReplayScheduler(
        _decider(scheduler, allow_library), budget, getattr(scheduler, "max_num_seqs", DEFAULT_MAX_NUM_SEQS)
    )
    engine = Engine(ToyExecutor(), replay, num_blocks=num_blocks, block_size=block_size, clock=VirtualClock())
    for r in workload:
        engine.add_request([1] * r.prompt_tokens, max_tokens=r.output_tokens, arrival_s=r.arrival_s)
    try:
        engine.run_until_done(max_steps=max_steps)
    except NotImplementedError:  # the exercise's stub, still there: its own error and traceback, not ours
        raise
    except RuntimeError as exc:  # an empty batch, or no progress
        message = str(exc).replace(type(replay).__name__, "your policy")
        raise AssertionError(f"the engine stopped your policy: {message}") from None
    except ValueError as exc:  # batch.add refused an entry made in this process
        raise AssertionError(f"step {len(replay.decisions)}: {exc}") from None
    return engine, replay


def _check_step(d: Decision, budget: int, check_fill: bool) -> None:
    total = sum(d.chosen.values())
    where = (
        f"step {d.step} (decoding {len(d.decoding)}, prefills in progress {len(d.in_progress)}, "
        f"new {len(d.new)}; you scheduled {d.chosen})"
    )
    if total > budget:
        raise AssertionError(f"{where}: {total} tokens exceed token_budget={budget}")
    if d.preempted:
        return  # memory pressure: the order rules do not apply to a step that had to preempt
    prefilled = any(i not in d.decoding for i in d.chosen)
    decodes_done = sum(1 for i in d.decoding if i in d.chosen)
    if prefilled and decodes_done < min(len(d.decoding), budget):
        raise AssertionError(
            f"{where}: a prefill ran while {len(d.decoding) - decodes_done} running decodes "
            "were left out. Schedule every running decode first (1 token each)."
        )
    kinds = [0 if i in d.decoding else 1 if i in d.in_progress else 2 for i in d.chosen]
    if kinds != sorted(kinds):
        raise AssertionError(
            f"{where}: add entries in Sarathi-Serve's order: running decodes, then prefills in progress, "
            "then new prompts."
        )
    if 2 in kinds:
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


def check_stall_free(
    policy,
    workload: list[Request],
    *,
    check_fill: bool = True,
    token_budget: int | None = None,
    allow_library: bool = False,
    **engine_kwargs,
) -> Engine:
    """Run ``policy`` on ``workload`` and assert the rules above; returns the engine.

    ``policy``: a ``Scheduler`` instance, or any object with ``decide(state) -> [[seq_id, num_tokens], ...]``
    (then give ``token_budget`` unless the object has that attribute). ``engine_kwargs``: ``num_blocks``,
    ``block_size``, ``max_steps`` of the toy engine.
    """
    budget = token_budget if token_budget is not None else getattr(policy, "token_budget", None)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise AssertionError(
            f"a token-budget scheduler must set self.token_budget to a positive integer, got {budget!r}"
        )
    engine, replay = run_policy(
        policy, workload, allow_library=allow_library, token_budget=budget, **engine_kwargs
    )
    for d in replay.decisions:
        _check_step(d, budget, check_fill)
    unfinished = [s.seq_id for s in engine.sequences if not s.is_finished]
    if unfinished:
        raise AssertionError(f"requests {unfinished} never finished")
    return engine
