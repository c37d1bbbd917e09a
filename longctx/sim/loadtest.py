"""The capstone's load test: 64 users resident in one KV pool at once, at H100 scale in the simulator.

A load test of a KV plan must put the plan's users in the pool *together*; one that queues them proves
nothing about memory. ``LoadTest`` chooses arrivals and lengths so that it does:

- ``users`` requests arrive evenly spread over ``arrival_window_s`` (64 in 2 s: a burst, as when a class
  or a batch job starts), each a ``prompt_tokens`` prompt (the ``shared_prefix_tokens`` system prompt, then
  its own tokens) and ``output_tokens`` outputs, so each holds ``prompt + output`` = 8,192 KV tokens at
  the end;
- prefilling all 64 prompts takes 7 to 10 s with vLLM's default token budget on an H100 (``vllm serve``'s
  ``max_num_batched_tokens`` = 8,192 on GPUs of 70 GiB or more), while the first user's 1,024 output tokens
  take about 26 s (its early decode steps carry the prefill chunks): the last user starts decoding long
  before the first one finishes, so when the pool is large enough all 64 decode together for about 17 s, at
  contexts between 7,168 and 8,192 tokens.

A configuration **passes** when all ``users`` ran in one step (``peak_running >= users``), nothing was
preempted, and the SLA holds (TTFT P99 <= ``ttft_p99_s``, ITL P99 <= ``itl_p99_s``); ``run_load_test``
returns a plain dict (JSON-ready, the row ``benchmarks/capstone.py sim`` records) that lists every failure.

``same_step_sharing=False`` is an intervention for prefix caching: full blocks are registered in the cache
only after the step that computes them (``RegisterAfterStep``), instead of as soon as a step is scheduled to
fill them (``ScheduledBatch.add``, vLLM's rule). Requests admitted in the same step as the first one to
compute a prefix then miss it and compute it again.

Pool: ``pool_gib`` GiB of the engine's layout (``longctx.plan.pool_blocks``, our per-vector / per-group
scales). No torch.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from longctx.checks import positive_int
from longctx.engine import ChunkedPrefillScheduler, Engine, VirtualClock, summarize
from longctx.kv.block_manager import BlockManager
from longctx.plan import plan, pool_blocks
from longctx.request_metrics import request_metrics
from longctx.sim.cost_model import CostModelExecutor
from longctx.sim.run import sim_prompt_ids
from longctx.sim.workload import Request
from longctx.specs import get_hardware, get_model


@dataclass(frozen=True)
class LoadTest:
    """One load test: the traffic, the engine's token budget, the pool and the SLA (seconds, tokens, GiB)."""

    users: int = 64
    prompt_tokens: int = 7_168
    output_tokens: int = 1_024
    shared_prefix_tokens: int = 2_048
    arrival_window_s: float = 2.0
    token_budget: int = 8_192
    pool_gib: float = 48.0
    hardware: str = "h100"
    ttft_p99_s: float = 15.0
    itl_p99_s: float = 0.25

    def __post_init__(self) -> None:
        for name in ("users", "prompt_tokens", "output_tokens", "token_budget"):
            positive_int(f"LoadTest.{name}", getattr(self, name))
        if not 0 <= self.shared_prefix_tokens < self.prompt_tokens:
            raise ValueError(
                f"LoadTest.shared_prefix_tokens must be in [0, prompt_tokens={self.prompt_tokens}), "
                f"got {self.shared_prefix_tokens}"
            )
        for name in ("arrival_window_s",):
            if not getattr(self, name) >= 0:
                raise ValueError(f"LoadTest.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("pool_gib", "ttft_p99_s", "itl_p99_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"LoadTest.{name} must be > 0, got {getattr(self, name)!r}")

    @property
    def context_tokens(self) -> int:
        """KV tokens a user holds at the end: prompt + output."""
        return self.prompt_tokens + self.output_tokens

    def workload(self) -> list[Request]:
        """``users`` requests, arrival ``i`` at ``i * window / users`` seconds."""
        return [Request(self.arrival_window_s * i / self.users, self.prompt_tokens, self.output_tokens)
                for i in range(self.users)]


CAPSTONE = LoadTest()


class RegisterAfterStep(BlockManager):
    """A block manager that registers full blocks in the prefix cache only after the step that computes them
    (call ``flush()`` after each step), not when the step is scheduled: the intervention that switches
    same-step sharing off. A sequence that finished (or was preempted) in the step registers nothing."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pending: list = []

    def cache_full_blocks(self, seq_id, token_ids, num_tokens) -> None:
        self._pending.append((seq_id, token_ids, num_tokens))

    def flush(self) -> None:
        for seq_id, token_ids, num_tokens in self._pending:
            if seq_id in self._tables:
                super().cache_full_blocks(seq_id, token_ids, num_tokens)
        self._pending.clear()


def _dist(d, scale: float = 1.0) -> dict:
    return {k: float(d.p(q)) * scale for k, q in (("p50", 50), ("p90", 90), ("p99", 99))}


def _failures(row: dict, test: LoadTest) -> list[str]:
    """Why a load test's ``row`` fails ``test`` (empty: it passes)."""
    failures = []
    if row["peak_running"] < test.users:
        failures.append(f"at most {row['peak_running']} of {test.users} users ran at once")
    if row["preemptions"]:
        failures.append(f"{row['preemptions']} preemption{'s' if row['preemptions'] > 1 else ''}")
    if row["ttft_s"]["p99"] > test.ttft_p99_s:
        failures.append(f"TTFT P99 {row['ttft_s']['p99']:.1f} s > {test.ttft_p99_s:g} s")
    if row["itl_ms"]["p99"] > 1e3 * test.itl_p99_s:
        failures.append(f"ITL P99 {row['itl_ms']['p99']:.0f} ms > {1e3 * test.itl_p99_s:g} ms")
    return failures


def run_load_test(model: str, kv_dtype: str, prefix_caching: bool, test: LoadTest = CAPSTONE,
                  same_step_sharing: bool = True, timeline: bool = False) -> dict:
    """Simulate ``test`` for one configuration; returns a JSON-ready row (see the module docstring).

    Row keys: the configuration; the plan for ``test.users`` (``planned_blocks``, ``pool_blocks``,
    ``plan_fits``, ``plan_max_users``, ``plan_gib``); what ran (``peak_running``, ``seconds_all_running``,
    ``peak_used_blocks``, ``preemptions``, ``prefill_tokens``, ``prefix_hit_tokens``); latency
    (``ttft_s`` and ``itl_ms`` with p50/p90/p99, ``tpot_p99_ms``, ``output_tok_s``, ``duration_s``); the
    verdict (``sla_met``, ``passes``, ``failures``); with ``timeline=True`` also ``steps``: per step
    ``[end_s, running, used_blocks]``."""
    t0 = time.perf_counter()
    m, hw = get_model(model), get_hardware(test.hardware)
    prefix = test.shared_prefix_tokens if prefix_caching else 0
    p = plan(m, kv_dtype, test.users, test.context_tokens, prefix, pool_gib=test.pool_gib)
    num_blocks = pool_blocks(m, kv_dtype, pool_gib=test.pool_gib)
    cls = BlockManager if same_step_sharing or not prefix_caching else RegisterAfterStep
    bm = cls(num_blocks, 16, enable_prefix_caching=prefix_caching)
    engine = Engine(
        CostModelExecutor(m, hw, None, "bf16", kv_dtype), ChunkedPrefillScheduler(test.token_budget),
        block_manager=bm, clock=VirtualClock(), max_model_len=test.context_tokens,
    )
    for i, r in enumerate(test.workload()):
        engine.add_request(sim_prompt_ids(i, r.prompt_tokens, prefix), r.output_tokens, arrival_s=r.arrival_s)
    flush = getattr(bm, "flush", None)
    while engine.has_unfinished():
        engine.step()
        if flush is not None:
            flush()
    seqs = sorted(engine.finished, key=lambda s: s.seq_id)
    metrics = summarize([request_metrics(s) for s in seqs])
    steps = engine.history
    peak_running = max(len(s.seq_ids) for s in steps)
    row = {
        "model": m.name, "kv_dtype": kv_dtype, "prefix_caching": bool(prefix_caching),
        "same_step_sharing": bool(same_step_sharing), "kv_bytes_per_token": p.bytes_per_token,
        "pool_blocks": num_blocks, "planned_blocks": p.blocks, "plan_fits": p.fits,
        "plan_max_users": p.max_users, "plan_gib": p.gib, "peak_running": peak_running,
        "seconds_all_running": sum(s.duration_s for s in steps if len(s.seq_ids) >= test.users),
        "peak_used_blocks": max(s.num_used_blocks for s in steps),
        "preemptions": sum(s.num_preemptions for s in seqs),
        "prefill_tokens": sum(s.num_prefill_tokens for s in steps),
        "prefix_hit_tokens": sum(s.num_prefix_cached_tokens for s in seqs), "ttft_s": _dist(metrics.ttft),
        "itl_ms": _dist(metrics.itl, 1e3), "tpot_p99_ms": float(metrics.tpot.p(99)) * 1e3,
        "output_tok_s": float(metrics.output_throughput), "duration_s": float(metrics.duration_s),
        "completed": metrics.completed,
    }
    failures = _failures(row, test)
    row["sla_met"] = not any(f.startswith(("TTFT", "ITL")) for f in failures)
    row["passes"] = not failures
    row["failures"] = failures
    if timeline:
        row["steps"] = [[s.end_s, len(s.seq_ids), s.num_used_blocks] for s in steps]
    row["wall_s"] = time.perf_counter() - t0
    return row


def describe(test: LoadTest = CAPSTONE) -> dict:
    """The test's parameters as a plain dict (for a record's ``meta``)."""
    return {**asdict(test), "context_tokens": test.context_tokens}
