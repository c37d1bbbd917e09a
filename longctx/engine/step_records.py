"""What the engine records as it runs: one ``StepRecord`` per step, and running totals (``EngineCounters``).

Counters are cumulative since the engine was made and count what vLLM's Prometheus counters count (the
server exports them at ``/metrics``: ``longctx.serve.prometheus``). Times are seconds on the engine clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """What one step did, the course's one step record: times in seconds on the engine clock. The engine fills
    every field; a timeline made otherwise (lesson 01's napkin model, a recorded run) gives the first five
    (``StepRecord.at``) and the rest stay empty."""

    start_s: float
    end_s: float
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    seq_ids: tuple[int, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    num_preempted: int = 0
    num_free_blocks: int = 0  # after the step (finished sequences' blocks returned)
    num_used_blocks: int = 0  # held while the step ran (a shared block counts once)

    @classmethod
    def at(
        cls, start_s: float, duration_s: float, num_prefill_tokens: int, num_decode_tokens: int
    ) -> StepRecord:
        """A step known by its start, duration and token counts only."""
        return cls(start_s, start_s + duration_s, duration_s, num_prefill_tokens, num_decode_tokens)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def kind(self) -> str:
        return step_kind(self)


def step_kind(step) -> str:
    """``"decode"``, ``"prefill"``, ``"mixed"`` or ``"idle"``, from a step's token counts."""
    if step.num_prefill_tokens and step.num_decode_tokens:
        return "mixed"
    if step.num_prefill_tokens:
        return "prefill"
    return "decode" if step.num_decode_tokens else "idle"


@dataclass
class EngineCounters:
    """Running totals of an engine (plain ints; the engine loop is their only writer).

    - ``num_prompt_tokens``: the prompt length of each request, counted when its first token appears (cached
      prefix tokens included), as vLLM's ``prompt_tokens``;
    - ``num_generation_tokens``: output tokens produced (vLLM's ``generation_tokens``);
    - ``num_preemptions``: preemption events (a sequence preempted twice counts twice; ``num_preemptions``);
    - ``prefix_cache_queries`` / ``prefix_cache_hits``: tokens looked up in the prefix cache when a waiting
      sequence with nothing computed is considered for admission, and how many of them were cached (vLLM
      counts per lookup as well, so a request that waits and is looked up again counts again);
    - ``num_press_evicted_tokens`` / ``num_press_freed_blocks``: K/V entries (per KV head) a KV press evicted
      and the blocks that returned to the pool because of it (no vLLM counterpart: vLLM does not prune).
    """

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_press_evicted_tokens: int = 0
    num_press_freed_blocks: int = 0
