"""The source's Exercise 1 (lessons 01 and 02), defined once, run on any engine (the simulator here, the
real model in ``longctx.gpu``'s suite).

``num_decode_streams`` sequences decode; then one ``prompt_tokens`` prompt arrives. A monolithic scheduler
stalls every stream for the whole prefill; chunked prefill by at most one budget-sized step.
``Exercise1.run(engine)`` drives an ``Engine`` through the protocol and measures on the engine's clock;
``exercise1(scheduler, model, hardware)`` runs it in the simulator (``longctx.sim.build_sim_engine``).
No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler, Scheduler, StepRecord
from longctx.memory import blocks_for_tokens
from longctx.sim.cost_model import CostFactors
from longctx.sim.run import build_sim_engine

LONG_PROMPT_OUTPUT_TOKENS = 16  # the long prompt's answer: the run stops before it ends


def scheduler_name(scheduler: Scheduler) -> str:
    """``"monolithic"`` or ``"chunked-<token_budget>"``."""
    budget = getattr(scheduler, "token_budget", None)
    return "monolithic" if budget is None else f"chunked-{budget}"


@dataclass
class Exercise1Result:
    """One scheduler's run of Exercise 1. Times in seconds on the engine's clock.

    ``steps``: every iteration from the long prompt's arrival until ``tail_steps`` after its first token;
    ``step_sequences``: for each of those steps, its entries ``(new_tokens, cached_tokens)`` when the run
    had a recorder (the GPU suite calibrates the simulator on them), else None.
    ``stream_token_times_s``: for each decoding stream, its token times in that window (from its last
    token before the arrival). ``steady_itl_s``: median gap before the arrival.
    """

    scheduler: str
    arrival_s: float
    long_prompt_ttft_s: float
    steady_itl_s: float
    max_itl_s: float
    steps: list[StepRecord] = field(repr=False)
    stream_token_times_s: list[list[float]] = field(repr=False)
    step_sequences: list[tuple[tuple[int, int], ...]] | None = field(default=None, repr=False)

    @property
    def jitter(self) -> float:
        """Worst gap after the arrival over the steady gap (the source's 57x, on its own numbers)."""
        return self.max_itl_s / self.steady_itl_s

    def stream_itl_s(self) -> list[list[float]]:
        """Inter-token gaps of each stream in the window."""
        return [list(np.diff(t)) for t in self.stream_token_times_s]

    def to_dict(self) -> dict:
        """Plain data (a GPU record's run): gaps pooled over the streams, steps with their entries."""
        seqs = self.step_sequences or [None] * len(self.steps)
        return {"scheduler": self.scheduler, "arrival_s": self.arrival_s, "ttft_s": self.long_prompt_ttft_s,
                "steady_itl_s": self.steady_itl_s, "max_itl_s": self.max_itl_s,
                "itl_s": [float(g) for s in self.stream_itl_s() for g in s],
                "stream_token_times_s": self.stream_token_times_s,
                "steps": [{"start_s": st.start_s, "end_s": st.end_s, "duration_s": st.duration_s,
                           "sequences": None if q is None else [list(p) for p in q]}
                          for st, q in zip(self.steps, seqs, strict=True)]}


@dataclass(frozen=True)
class Exercise1:
    """The scenario's sizes (the source's: 16 streams at 1K context, a 12K-token prompt)."""

    num_decode_streams: int = 16
    prompt_tokens: int = 12_000
    stream_context_tokens: int = 1024
    warmup_steps: int = 20
    tail_steps: int = 10

    def __post_init__(self) -> None:
        for name in ("num_decode_streams", "prompt_tokens", "stream_context_tokens", "warmup_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tail_steps < 0:
            raise ValueError(f"tail_steps must be >= 0, got {self.tail_steps}")

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

    def run(self, engine, recorder=None) -> Exercise1Result:
        """Drive ``engine`` (an ``Engine`` with no requests yet) through the scenario.

        ``recorder``: the ``RecordingExecutor`` the engine runs, to keep each step's entries (optional).
        """
        budget = getattr(engine.scheduler, "token_budget", None)
        out = self.stream_output_tokens(budget)
        streams = [engine.add_request([0] * self.stream_context_tokens, out, arrival_s=engine.clock.now())
                   for _ in range(self.num_decode_streams)]
        while not all(s.is_decode and s.num_output_tokens > 1 for s in streams):
            engine.step()
        for _ in range(self.warmup_steps):
            engine.step()
        steady = float(np.median([g for s in streams for g in s.itl_s[-self.warmup_steps:]]))
        first = [len(s.token_times_s) - 1 for s in streams]
        n_hist, n_rec = len(engine.history), len(recorder.steps) if recorder else 0
        arrival_s = engine.clock.now()
        long_req = engine.add_request([0] * self.prompt_tokens, LONG_PROMPT_OUTPUT_TOKENS, arrival_s=arrival_s)
        while not long_req.token_times_s:
            engine.step()
        for _ in range(self.tail_steps):
            engine.step()
        times = [s.token_times_s[i:] for s, i in zip(streams, first, strict=True)]
        return Exercise1Result(
            scheduler=scheduler_name(engine.scheduler),
            arrival_s=float(arrival_s),
            long_prompt_ttft_s=float(long_req.ttft_s),
            steady_itl_s=steady,
            max_itl_s=float(max(g for t in times for g in np.diff(t))),
            steps=engine.history[n_hist:],
            stream_token_times_s=[[float(x) for x in t] for t in times],
            step_sequences=[m.sequences for m in recorder.steps[n_rec:]] if recorder else None,
        )


def exercise1(
    scheduler: Scheduler,
    model: str = "teaching-7b-mha",
    hardware: str = "h100",
    num_decode_streams: int = 16,
    prompt_tokens: int = 12_000,
    stream_context_tokens: int = 1024,
    warmup_steps: int = 20,
    tail_steps: int = 10,
    factors: CostFactors | None = None,
) -> Exercise1Result:
    """Exercise 1 in the simulator with ``scheduler`` on ``model`` and ``hardware``."""
    scenario = Exercise1(num_decode_streams, prompt_tokens, stream_context_tokens, warmup_steps, tail_steps)
    engine = build_sim_engine(scheduler, model, hardware, factors, max_model_len=scenario.max_model_len())
    return scenario.run(engine)


def exercise1_compare(budgets: Sequence[int] = (512, 1024, 2048), **kwargs) -> dict[str, Exercise1Result]:
    """Exercise 1 with the monolithic scheduler and chunked prefill at each budget, keyed by name."""
    out = {"monolithic": exercise1(MonolithicScheduler(), **kwargs)}
    for b in budgets:
        out[f"chunked-{b}"] = exercise1(ChunkedPrefillScheduler(token_budget=b), **kwargs)
    return out
