"""The decode-stall scenario (the source's Exercise 1), defined once and run three ways.

``StallScenario``: ``num_decode_streams`` users decode, each with ``stream_context_tokens`` of context, when
one ``prompt_tokens``-token prompt arrives. A monolithic (prefill-first) scheduler stalls every stream for the
whole prefill; chunked prefill by at most one budget-sized step. It runs

- on the napkin (lesson 01): ``scenario.timeline(NapkinCosts(...), chunk_size)``, fixed step times;
- on any ``Engine`` (``scenario.run(engine)``): the simulator (``exercise1`` / ``exercise1_compare``,
  lessons 01-02) or the real model, measured on the engine's clock;
- against a server (lesson 08): ``longctx.lessons.stall_server.run_stall``, built from ``scenario.requests``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from longctx.checks import positive_int
from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler, Scheduler, StepRecord
from longctx.memory import blocks_for_tokens
from longctx.sim.cost_model import CostFactors
from longctx.sim.run import build_sim_engine

LONG_PROMPT_OUTPUT_TOKENS = 16  # the long prompt's answer: an engine run stops before it ends


@dataclass(frozen=True)
class NapkinCosts:
    """Lesson 01's fixed step times: ``decode_step_s`` for an iteration that only decodes (the steady ITL),
    ``prefill_s_per_token`` per prompt token (e.g. 2·N_params / FLOP/s), and ``chunk_decode_overhead_s``,
    what the decodes add to an iteration that also runs a prefill chunk."""

    decode_step_s: float
    prefill_s_per_token: float
    chunk_decode_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("decode_step_s", "prefill_s_per_token"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.chunk_decode_overhead_s < 0:
            raise ValueError(
                f"chunk_decode_overhead_s cannot be negative, got {self.chunk_decode_overhead_s}"
            )


@dataclass(frozen=True)
class StallScenario:
    """The scenario's sizes; the defaults are the source's (16 streams at 1K context, a 12K-token prompt).
    ``warmup_steps`` / ``tail_steps``: engine steps before the arrival and after the prompt's first token."""

    num_decode_streams: int = 16
    prompt_tokens: int = 12_000
    stream_context_tokens: int = 1024
    warmup_steps: int = 20
    tail_steps: int = 10

    def __post_init__(self) -> None:
        for name in ("num_decode_streams", "prompt_tokens", "stream_context_tokens", "warmup_steps"):
            positive_int(name, getattr(self, name), floats=False)
        if self.tail_steps < 0:
            raise ValueError(f"tail_steps must be >= 0, got {self.tail_steps}")

    # -- on the napkin ---------------------------------------------------------------------------------------
    def num_chunks(self, chunk_size: int) -> int:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1 token, got {chunk_size}")
        return blocks_for_tokens(self.prompt_tokens, chunk_size)  # ceil(prompt / chunk)

    def timeline(self, costs: NapkinCosts, chunk_size: int | None = None, steps_before: int = 5,
                 steps_after: int = 5) -> list[StepRecord]:
        """The iterations around the prompt's arrival at ``costs``; ``chunk_size=None``: monolithic
        prefill."""
        if chunk_size is not None:
            self.num_chunks(chunk_size)  # validates chunk_size
        if steps_before < 0 or steps_after < 0:
            raise ValueError("steps_before and steps_after must be >= 0")
        n, records = self.num_decode_streams, []

        def add(duration_s: float, prefill_tokens: int, decode_tokens: int) -> None:
            start = records[-1].start_s + records[-1].duration_s if records else 0.0
            records.append(StepRecord.at(start, duration_s, prefill_tokens, decode_tokens))

        for _ in range(steps_before):
            add(costs.decode_step_s, 0, n)
        if chunk_size is None:
            add(self.prompt_tokens * costs.prefill_s_per_token, self.prompt_tokens, 0)
        else:
            for start in range(0, self.prompt_tokens, chunk_size):
                chunk = min(chunk_size, self.prompt_tokens - start)
                add(chunk * costs.prefill_s_per_token + costs.chunk_decode_overhead_s, chunk, n)
        for _ in range(steps_after):
            add(costs.decode_step_s, 0, n)
        return records

    # -- on an engine ----------------------------------------------------------------------------------------
    def stream_output_tokens(self, token_budget: int | None) -> int:
        """An output length no stream reaches before the run stops (steps a stream can decode in)."""
        n, budget = self.num_decode_streams, token_budget
        if budget is None:
            start, prompt = n, 1  # each stream's prefill alone, then the prompt in one step
        else:
            spare = max(1, budget - n)  # prompt tokens a step holds beside the decodes
            start = blocks_for_tokens(n * self.stream_context_tokens, spare) + n
            prompt = blocks_for_tokens(self.prompt_tokens, spare)
        return start + self.warmup_steps + prompt + self.tail_steps + 64

    def kv_blocks(self, block_size: int, token_budget: int | None) -> int:
        """KV blocks the whole run needs: every stream to its longest, plus the long prompt."""
        stream = self.stream_context_tokens + self.stream_output_tokens(token_budget)
        return (self.num_decode_streams * blocks_for_tokens(stream, block_size)
                + blocks_for_tokens(self.prompt_tokens + LONG_PROMPT_OUTPUT_TOKENS, block_size))

    def max_model_len(self) -> int:
        return max(self.prompt_tokens, self.stream_context_tokens) + 1

    def run(self, engine) -> StallResult:
        """Drive ``engine`` (an ``Engine`` with no requests yet) through the scenario on its own clock."""
        budget = getattr(engine.scheduler, "token_budget", None)
        out = self.stream_output_tokens(budget)
        streams = [engine.add_request([0] * self.stream_context_tokens, out, arrival_s=engine.clock.now())
                   for _ in range(self.num_decode_streams)]
        while not all(s.is_decode and s.num_output_tokens > 1 for s in streams):
            engine.step()
        for _ in range(self.warmup_steps):
            engine.step()
        steady = float(np.median([g for s in streams for g in s.itl_s[-self.warmup_steps:]]))
        first, n_hist, arrival_s = (
            [len(s.token_times_s) - 1 for s in streams], len(engine.history), engine.clock.now()
        )
        long_req = engine.add_request([0] * self.prompt_tokens, LONG_PROMPT_OUTPUT_TOKENS,
                                      arrival_s=arrival_s)
        while not long_req.token_times_s:
            engine.step()
        for _ in range(self.tail_steps):
            engine.step()
        times = [s.token_times_s[i:] for s, i in zip(streams, first, strict=True)]
        return StallResult(scheduler_name(engine.scheduler), float(arrival_s), float(long_req.ttft_s), steady,
                           float(max(g for t in times for g in np.diff(t))), engine.history[n_hist:],
                           [[float(x) for x in t] for t in times])

    # -- against a server ------------------------------------------------------------------------------------
    def requests(self, tokenizer, chat_max_tokens: int = 48, num_long: int = 1, long_max_tokens: int = 4,
                 long_at_s: float = 1.0, seed: int = 0) -> tuple[list[dict], list[float]]:
        """(requests, send offsets in s): ``num_decode_streams`` chat users (a story each) at ~0 s, then
        ``num_long`` prompts of ``prompt_tokens`` at ``long_at_s``. A server's chat prompts are what they are:
        ``stream_context_tokens`` is an engine run's size only."""
        from longctx.bench.workloads import build_workload, count_chat_tokens

        if num_long < 0:
            raise ValueError(f"num_long must be >= 0, got {num_long}")
        chats = []
        for i in range(self.num_decode_streams):
            text = f"Tell me a long story about {STORY_TOPICS[(seed + i) % len(STORY_TOPICS)]}."
            chats.append({"messages": [{"role": "user", "content": text}], "max_tokens": chat_max_tokens,
                          "kind": "chat", "prompt_tokens": count_chat_tokens(tokenizer, text)})
        longs = build_workload("long-prefill", num_long, tokenizer, self.prompt_tokens, long_max_tokens,
                               seed) if num_long else []
        offsets = [0.02 * i for i in range(len(chats))] + [long_at_s + 0.02 * i for i in range(num_long)]
        return chats + longs, offsets


STORY_TOPICS = ("a lighthouse keeper", "a lost map", "two rival bakers", "a clockmaker's apprentice",
                "a storm at sea", "a mountain village", "a travelling circus", "an old library")


@dataclass
class StallResult:
    """One scheduler's engine run of the scenario, in seconds on the engine's clock. ``steps``: every
    iteration from the arrival until ``tail_steps`` after the prompt's first token; ``stream_token_times_s``:
    each stream's token times in that window (from its last token before the arrival); ``steady_itl_s``: the
    median gap before the arrival."""

    scheduler: str
    arrival_s: float
    long_prompt_ttft_s: float
    steady_itl_s: float
    max_itl_s: float
    steps: list[StepRecord] = field(repr=False)
    stream_token_times_s: list[list[float]] = field(repr=False)

    @property
    def jitter(self) -> float:
        """Worst gap after the arrival over the steady gap (the source's 57x, on its own numbers)."""
        return self.max_itl_s / self.steady_itl_s

Exercise1, Exercise1Result = StallScenario, StallResult  # the source's name for the scenario


def scheduler_name(scheduler: Scheduler) -> str:
    """``"monolithic"`` or ``"chunked-<token_budget>"``."""
    budget = getattr(scheduler, "token_budget", None)
    return "monolithic" if budget is None else f"chunked-{budget}"


def decode_token_times(records: list[StepRecord]) -> list[float]:
    """When a decoding stream receives each token: at the end of every iteration that decoded."""
    return [r.start_s + r.duration_s for r in records if r.num_decode_tokens > 0]


def max_inter_token_latency_s(records: list[StepRecord]) -> float:
    """Longest gap between two consecutive tokens of a decoding stream (the first gap counts from t=0)."""
    times = [0.0, *decode_token_times(records)]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


def exercise1(scheduler: Scheduler, model: str = "teaching-7b-mha", hardware: str = "h100",
              scenario: StallScenario | None = None, factors: CostFactors | None = None) -> StallResult:
    """The scenario (default: the source's sizes) in the simulator with ``scheduler`` on ``model``."""
    scenario = scenario or StallScenario()
    engine = build_sim_engine(scheduler, model, hardware, factors, max_model_len=scenario.max_model_len())
    return scenario.run(engine)


def exercise1_compare(budgets: Sequence[int] = (512, 1024, 2048), **kwargs) -> dict[str, StallResult]:
    """``exercise1`` with the monolithic scheduler and chunked prefill at each budget, keyed by name."""
    out = {"monolithic": exercise1(MonolithicScheduler(), **kwargs)}
    for b in budgets:
        out[f"chunked-{b}"] = exercise1(ChunkedPrefillScheduler(token_budget=b), **kwargs)
    return out
