"""Decode starvation by hand: the iteration timeline of N decoding streams when one long prompt arrives.

This is the napkin model of lesson 01 (the source's Exercise 1): a decode step takes a fixed time, a
prefill takes a fixed time per prompt token, and a scheduler either runs the whole prompt alone
(monolithic, prefill-first) or one chunk per iteration beside every decode (chunked prefill).
The simulator (``longctx.sim``) replaces the fixed times with a roofline cost model; the engine
replaces them with measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.memory import blocks_for_tokens
from longctx.plots import IterationRecord, iteration_kind  # noqa: F401 (re-exported: the timeline's records)


@dataclass(frozen=True)
class StallScenario:
    """N streams decoding at a steady step time; one prompt of ``prompt_tokens`` arrives.

    ``prefill_s_per_token`` is the prefill cost of one prompt token (for example 2·N_params / FLOP/s);
    ``decode_step_s`` is the time of one iteration that only decodes (the steady inter-token latency);
    ``chunk_decode_overhead_s`` is what the decodes add to an iteration that also runs a prefill chunk.
    """

    num_decode_streams: int
    decode_step_s: float
    prompt_tokens: int
    prefill_s_per_token: float
    chunk_decode_overhead_s: float = 0.0

    def __post_init__(self):
        if self.num_decode_streams < 1:
            raise ValueError(f"num_decode_streams must be at least 1, got {self.num_decode_streams}")
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be at least 1, got {self.prompt_tokens}")
        for name in ("decode_step_s", "prefill_s_per_token"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.chunk_decode_overhead_s < 0:
            raise ValueError(f"chunk_decode_overhead_s cannot be negative, got {self.chunk_decode_overhead_s}")

    @property
    def prefill_s(self) -> float:
        """Time of the whole prompt's prefill run alone."""
        return self.prompt_tokens * self.prefill_s_per_token

    def num_chunks(self, chunk_size: int) -> int:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1 token, got {chunk_size}")
        return blocks_for_tokens(self.prompt_tokens, chunk_size)  # ceil(prompt / chunk)

    def timeline(self, chunk_size: int | None = None, steps_before: int = 5,
                 steps_after: int = 5) -> list[IterationRecord]:
        """Iterations around the prompt's arrival; ``chunk_size=None`` means monolithic prefill."""
        if chunk_size is not None:
            self.num_chunks(chunk_size)  # validates chunk_size
        if steps_before < 0 or steps_after < 0:
            raise ValueError("steps_before and steps_after must be >= 0")
        records: list[IterationRecord] = []
        clock_s = 0.0

        def add(duration_s: float, prefill_tokens: int, decode_tokens: int) -> None:
            nonlocal clock_s
            records.append(IterationRecord(clock_s, duration_s, prefill_tokens, decode_tokens))
            clock_s += duration_s

        for _ in range(steps_before):
            add(self.decode_step_s, 0, self.num_decode_streams)
        if chunk_size is None:
            add(self.prefill_s, self.prompt_tokens, 0)
        else:
            remaining = self.prompt_tokens
            while remaining > 0:
                chunk = min(chunk_size, remaining)
                add(chunk * self.prefill_s_per_token + self.chunk_decode_overhead_s, chunk, self.num_decode_streams)
                remaining -= chunk
        for _ in range(steps_after):
            add(self.decode_step_s, 0, self.num_decode_streams)
        return records


def decode_token_times(records: list[IterationRecord]) -> list[float]:
    """When a decoding stream receives each token: at the end of every iteration that decoded."""
    return [r.start_s + r.duration_s for r in records if r.num_decode_tokens > 0]


def max_inter_token_latency_s(records: list[IterationRecord]) -> float:
    """Longest gap between two consecutive tokens of a decoding stream (the first gap counts from t=0)."""
    times = [0.0, *decode_token_times(records)]
    return max(b - a for a, b in zip(times, times[1:], strict=False))
