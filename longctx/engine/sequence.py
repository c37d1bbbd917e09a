"""A request as the engine sees it: token ids, how many are in the KV cache, timestamps.

A sequence holds ``prompt_token_ids + output_token_ids``. ``num_computed_tokens`` of them have their K/V in
the cache. Each step advances a sequence by some tokens (a prefill chunk, or one decode token); when every
token is computed the step samples one new output token. So:

- a *prefill* still has ``num_uncomputed_tokens > 1`` (or has produced nothing yet);
- a *decode* has exactly one uncomputed token: the last output token, fed back in.

Preemption by recompute (vLLM's ``RECOMPUTE`` mode) throws the cache away: ``num_computed_tokens`` drops to
0 and the sequence, prompt and outputs so far, is prefilled again later. Its outputs are kept.

KV pruning (``longctx.kv.press``) evicts cached tokens without forgetting where the sequence is:
``num_computed_tokens`` still counts positions (a new token's RoPE position), ``num_evicted_tokens`` the
K/V entries thrown away, and ``num_cached_tokens`` (their difference) the entries each KV head holds.

``sampling`` (``SamplingParams``, or None for greedy) is how the executor picks the sequence's tokens.

Times are seconds on the engine's clock. ``ScheduledChunk`` (one entry of a step's batch: a sequence and the
tokens it advances; ``longctx.engine.batch`` imports it from here) is defined at the end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from longctx.engine.sampling_params import SamplingParams
from longctx.request_metrics import request_metrics


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # arrived, not started, or preempted: owns no KV blocks
    RUNNING = "running"  # owns KV blocks, is being prefilled or decoded
    FINISHED = "finished"  # done; its blocks were freed


@dataclass(eq=False, slots=True)  # slots: the simulator reads these fields millions of times
class Sequence:
    """One request. Created by ``Engine.add_request``; read it, don't mutate it from a scheduler."""

    seq_id: int
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_s: float = 0.0
    eos_token_id: int | None = None
    sampling: SamplingParams | None = None  # None: greedy
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_evicted_tokens: int = 0  # K/V entries a press evicted (per KV head); 0 without pruning
    num_prefix_cached_tokens: int = 0  # prompt tokens its last admission found in the prefix cache
    output_token_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)  # clock time each output token appeared
    first_scheduled_s: float | None = None
    finished_s: float | None = None
    finish_reason: str | None = None  # "length" (max_tokens), "stop" (EOS) or "abort"
    num_preemptions: int = 0

    # ---- lengths ----
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_cached_tokens(self) -> int:
        """K/V entries the sequence holds per layer and KV head: computed tokens minus evicted ones."""
        return self.num_computed_tokens - self.num_evicted_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens that still have to go through the model before the next output token can be sampled."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """True when only the last output token is left to compute (one token per step)."""
        n_out = len(self.output_token_ids)  # inlined properties: the simulator calls this millions of times
        return n_out > 0 and len(self.prompt_token_ids) + n_out - self.num_computed_tokens == 1

    @property
    def is_prefill(self) -> bool:
        """True while the prompt (or, after preemption, prompt + outputs) is being computed."""
        return not self.is_decode

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def token_ids(self, start: int = 0, stop: int | None = None) -> list[int]:
        """Token ids at positions ``[start, stop)`` of prompt + output (copies only that range)."""
        prompt, n_prompt = self.prompt_token_ids, len(self.prompt_token_ids)
        stop = self.num_tokens if stop is None else stop
        if stop <= n_prompt:
            return prompt[start:stop]
        if start >= n_prompt:  # a decode, or a recompute past the prompt
            return self.output_token_ids[start - n_prompt : stop - n_prompt]
        return prompt[start:] + self.output_token_ids[: stop - n_prompt]

    # ---- timestamps ----
    @property
    def ttft_s(self) -> float | None:
        """Time to first token so far (``longctx.request_metrics``' definition); None before the first
        token."""
        return request_metrics(self).ttft_s if self.token_times_s else None

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies so far: gaps between consecutive output tokens (len = outputs - 1)."""
        return list(request_metrics(self).itl_s) if self.token_times_s else []

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, {self.status.value}, prompt={self.num_prompt_tokens}, "
            f"out={self.num_output_tokens}/{self.max_tokens}, computed={self.num_computed_tokens}"
            + (f", evicted={self.num_evicted_tokens})" if self.num_evicted_tokens else ")")
        )


class ScheduledChunk(NamedTuple):
    """One entry of a batch: advance ``seq`` by ``num_tokens`` tokens (1 for a decode, n for a prefill)."""

    seq: Sequence
    num_tokens: int

    @property
    def is_decode(self) -> bool:
        return self.seq.is_decode

    @property
    def completes_prefill(self) -> bool:
        """True when this entry reaches the end of its sequence, so the step samples a token for it
        (read after ``commit``, before the step's update)."""
        return self.num_tokens == self.seq.num_uncomputed_tokens
