"""Contiguous versus paged KV allocation over a mixed workload: where does the reserved memory go?

A pool of ``capacity_tokens`` token slots (multiply by ``memory.kv_bytes_per_token`` for bytes) serves a
backlog of requests, first come first served. Each step every running request produces one token; a
request finishes after ``output_tokens`` tokens and gives its memory back.

- **Contiguous** (what serving systems did before vLLM): a request reserves, at admission, one
  contiguous range as long as it may ever become (``max_model_len``, or its prompt plus its
  ``max_new_tokens`` cap), since its output length is unknown; ranges are placed first fit.
- **Paged** (vLLM's PagedAttention, Kwon et al., SOSP 2023): a request holds ``ceil(len / block_size)``
  blocks anywhere in the pool and takes one more block only when its last block is full. When the pool
  runs dry mid-decode the youngest running request is preempted (its blocks freed, recomputed later).

Every step the pool's slots are sorted into the categories of vLLM's Figure 2, in token slots:

- ``used``: slots that hold a token's K and V;
- ``reserved``: slots reserved for tokens the request will produce later (contiguous only);
- ``internal``: slots reserved that will never hold a token (contiguous: ``reserve - final length``;
  paged: the empty tail of each request's last block);
- ``external``: free slots that could not be used, because a waiting request needed a hole that large
  and the free slots were scattered in smaller holes (contiguous only);
- ``free``: the rest.

Pure Python, seeded, no numpy: a backlog of a few hundred requests simulates in well under a second.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from longctx.kv.block_manager import BlockManager
from longctx.memory import padded_tokens
from longctx.sim.workload import Request

CATEGORIES = ("used", "reserved", "internal", "external", "free")


def mixed_workload(
    num_requests: int, seed: int = 0, max_model_len: int = 4096, max_new_tokens: int = 1024
) -> list[Request]:
    """A seeded mix: ~70 % chat turns (prompts ~ 250 tokens), ~30 % documents (1K to 3K tokens).

    Output lengths are log-normal (median ~ 130 tokens), at most ``max_new_tokens``; every request fits
    ``max_model_len``.
    """
    if num_requests < 1 or max_model_len < 64 or max_new_tokens < 1:
        raise ValueError("need num_requests >= 1, max_model_len >= 64 and max_new_tokens >= 1")
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests):
        if rng.random() < 0.7:
            prompt = int(rng.lognormvariate(5.5, 0.6))  # chat: median e^5.5 ~ 245 tokens
        else:
            prompt = rng.randint(1_000, 3_000)  # a pasted document
        output = int(rng.lognormvariate(4.9, 0.7))  # median e^4.9 ~ 134 tokens
        prompt = max(1, min(prompt, max_model_len - 16))
        output = max(1, min(output, max_new_tokens, max_model_len - prompt))
        requests.append(Request(0.0, prompt, output))
    return requests


class ContiguousAllocator:
    """One contiguous range per request, first fit over ``[0, capacity_tokens)``.

    The range covers the longest the request may become: ``max_model_len`` slots, or, when the request
    states a cap ``max_new_tokens``, ``prompt + max_new_tokens`` slots (at most ``max_model_len``).
    Equal ranges tile the pool; unequal ones leave holes between them (external fragmentation).
    """

    name = "contiguous"
    reserves_ahead = True  # a request's range covers tokens it has not produced yet

    def __init__(self, capacity_tokens: int, max_model_len: int, max_new_tokens: int | None = None) -> None:
        if max_model_len < 1 or capacity_tokens < max_model_len:
            raise ValueError("need 1 <= max_model_len <= capacity_tokens")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1 (or None: reserve max_model_len)")
        self.capacity_tokens = capacity_tokens
        self.max_model_len = max_model_len
        self.max_new_tokens = max_new_tokens
        self._ranges: dict[int, tuple[int, int]] = {}  # request id -> (start, length)

    def _holes(self) -> list[tuple[int, int]]:
        """Free (start, length) ranges in address order."""
        holes, cursor = [], 0
        for start, length in sorted(self._ranges.values()):
            if start > cursor:
                holes.append((cursor, start - cursor))
            cursor = start + length
        if cursor < self.capacity_tokens:
            holes.append((cursor, self.capacity_tokens - cursor))
        return holes

    def slots_needed(self, tokens: int) -> int:
        """Slots reserved for a request admitted with ``tokens`` tokens (its prompt and first output
        token)."""
        if self.max_new_tokens is None:
            return self.max_model_len
        return min(self.max_model_len, tokens - 1 + self.max_new_tokens)

    def can_admit(self, tokens: int) -> bool:
        need = self.slots_needed(tokens)
        return any(length >= need for _, length in self._holes())

    def admit(self, request_id: int, tokens: int) -> None:
        need = self.slots_needed(tokens)
        for start, length in self._holes():
            if length >= need:
                self._ranges[request_id] = (start, need)
                return
        raise ValueError(f"no contiguous hole of {need} slots for request {request_id}")

    def grow(self, request_id: int, tokens: int) -> bool:
        """Room for ``tokens`` tokens in total? The reservation already covers them."""
        return tokens <= self._ranges[request_id][1]

    def free(self, request_id: int) -> None:
        del self._ranges[request_id]

    def allocated_slots(self, request_id: int) -> int:
        return self._ranges[request_id][1]

    def free_slots(self) -> int:
        return self.capacity_tokens - sum(length for _, length in self._ranges.values())


class PagedAllocator:
    """Paged allocation as the engine does it: a thin adapter over ``longctx.kv.block_manager.BlockManager``
    (``ceil(tokens / block_size)`` blocks per request, any block anywhere, one more only when the last is
    full), speaking this module's allocator interface in token slots."""

    name = "paged"
    reserves_ahead = False

    def __init__(self, capacity_tokens: int, block_size: int = 16) -> None:
        if block_size < 1 or capacity_tokens < block_size:
            raise ValueError("need 1 <= block_size <= capacity_tokens")
        self.block_size = block_size
        self.pool = BlockManager(capacity_tokens // block_size, block_size)
        self.capacity_tokens = self.pool.capacity_tokens

    def slots_needed(self, tokens: int) -> int:
        return padded_tokens(tokens, self.block_size)

    def can_admit(self, tokens: int) -> bool:
        return self.slots_needed(tokens) <= self.free_slots()

    def admit(self, request_id: int, tokens: int) -> None:
        if not self.can_admit(tokens):
            raise ValueError(f"not enough free blocks for request {request_id}")
        self.pool.allocate(request_id, tokens)

    def grow(self, request_id: int, tokens: int) -> bool:
        """Make room for ``tokens`` tokens in total; False (nothing changed) if the pool is out of blocks."""
        if not self.pool.can_allocate(request_id, tokens):
            return False
        self.pool.allocate(request_id, tokens)
        return True

    def free(self, request_id: int) -> None:
        self.pool.free(request_id)

    def allocated_slots(self, request_id: int) -> int:
        return len(self.pool.block_table(request_id)) * self.block_size

    def free_slots(self) -> int:
        return self.pool.num_free_blocks * self.block_size


@dataclass
class AllocationResult:
    """Slot-steps per category (summed over steps), and what the run achieved."""

    allocator: str
    capacity_tokens: int
    steps: int
    slot_steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    backlog_steps: int = 0  # steps during which some request was still waiting for memory
    backlog_slot_steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    finished: int = 0
    preemptions: int = 0
    concurrency_sum: int = 0

    def fraction(self, category: str, backlog_only: bool = False) -> float:
        """Time-averaged fraction of the pool in ``category``: over all steps, or (``backlog_only``) over the
        steps during which requests were waiting, i.e. while memory was the limit."""
        if backlog_only:
            return self.backlog_slot_steps[category] / (self.capacity_tokens * max(self.backlog_steps, 1))
        return self.slot_steps[category] / (self.capacity_tokens * self.steps)

    @property
    def waste_fraction(self) -> float:
        """Share of the *allocated* slots holding no token: (reserved + internal) / (used + reserved +
        internal)."""
        s = self.slot_steps
        allocated = s["used"] + s["reserved"] + s["internal"]
        return (s["reserved"] + s["internal"]) / allocated if allocated else 0.0

    @property
    def mean_concurrency(self) -> float:
        return self.concurrency_sum / self.steps


def _account(result: AllocationResult, allocator, running: dict, waiting: deque) -> None:
    """Add one step's slots, by category, to ``result`` (and to its backlog tally while requests wait)."""
    tally = dict.fromkeys(CATEGORIES, 0)
    for rid, (r, tokens) in running.items():
        alloc = allocator.allocated_slots(rid)
        tally["used"] += tokens
        future = min(alloc, r.total_tokens) - tokens
        reserved = future if allocator.reserves_ahead else 0
        tally["reserved"] += reserved
        tally["internal"] += alloc - tokens - reserved
    free = allocator.free_slots()
    head_need = allocator.slots_needed(waiting[0][1].prompt_tokens + 1) if waiting else None
    if head_need is not None and free >= head_need:
        tally["external"] = free  # enough free slots in total, but no hole is large enough
    else:
        tally["free"] = free
    for k in CATEGORIES:
        result.slot_steps[k] += tally[k]
        if waiting:
            result.backlog_slot_steps[k] += tally[k]
    result.backlog_steps += bool(waiting)
    result.concurrency_sum += len(running)
    result.steps += 1


def simulate_allocation(requests: list[Request], allocator, max_steps: int = 100_000) -> AllocationResult:
    """Serve ``requests`` (all waiting at step 0, in order; a request's id is its position) with ``allocator``
    until all finish; returns the tally.

    (Not ``longctx.sim.simulate``, which runs the serving engine on a cost model: this only allocates.)
    """
    waiting = deque(enumerate(requests))  # (id, request)
    running: dict[int, tuple[Request, int]] = {}  # id -> (request, tokens stored so far)
    result = AllocationResult(allocator.name, allocator.capacity_tokens, 0)
    for rid, r in waiting:
        if allocator.slots_needed(r.total_tokens) > allocator.capacity_tokens:
            raise ValueError(f"request {rid} ({r.total_tokens} tokens) can never fit the pool")
        if allocator.reserves_ahead and allocator.slots_needed(r.prompt_tokens + 1) < r.total_tokens:
            raise ValueError(f"request {rid} ({r.total_tokens} tokens) outgrows its contiguous reservation")
    while (waiting or running) and result.steps < max_steps:
        # 1. admit FCFS: prefill the prompt and its first output token
        while waiting and allocator.can_admit(waiting[0][1].prompt_tokens + 1):
            rid, r = waiting.popleft()
            allocator.admit(rid, r.prompt_tokens + 1)
            running[rid] = (r, r.prompt_tokens + 1)
        if not running:
            raise ValueError(f"request {waiting[0][0]} cannot be admitted into an empty pool")
        _account(result, allocator, running, waiting)  # 2. the pool as it stands during this step
        # 3. every running request produces one token; finished ones leave
        for rid in sorted(running):
            if rid not in running:
                continue
            r, tokens = running[rid]
            if tokens >= r.total_tokens:
                allocator.free(rid)
                del running[rid]
                result.finished += 1
                continue
            while not allocator.grow(rid, tokens + 1):
                victim = max(running)  # the youngest (highest id, admitted last) gives its blocks back
                allocator.free(victim)
                waiting.appendleft((victim, running.pop(victim)[0]))
                result.preemptions += 1
                if victim == rid:
                    break
            if rid in running:
                running[rid] = (r, tokens + 1)
    return result


def compare(
    requests: list[Request],
    capacity_tokens: int,
    max_model_len: int,
    max_new_tokens: int | None = None,
    block_size: int = 16,
) -> dict[str, AllocationResult]:
    """Run the same backlog through a contiguous pool and a paged pool of the same capacity."""
    return {
        "contiguous": simulate_allocation(
            requests, ContiguousAllocator(capacity_tokens, max_model_len, max_new_tokens)
        ),
        "paged": simulate_allocation(requests, PagedAllocator(capacity_tokens, block_size)),
    }
