"""The executor protocol: run a ``ScheduledBatch``, report how long it took and the sampled tokens.

Two real implementations: ``TorchExecutor`` (``longctx.engine.torch_executor``, the real model on the paged
KV cache) and a cost-model executor (``longctx.sim``). ``ToyExecutor`` here is a linear cost model with
dummy tokens, for tests and examples: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from longctx.engine.batch import ScheduledBatch


@dataclass(frozen=True)
class ExecutionResult:
    """``duration_s``: how long the step took (measured or modelled).

    ``next_token_ids``: one token id per batch entry, in ``batch.entries`` order; only the entries that
    reach the end of their sequence (all its tokens computed) use theirs. ``None`` when the executor produces no
    real tokens (a cost model): the engine then appends a dummy token and stops by ``max_tokens`` only.

    ``evicted_tokens``: for KV pruning, the entries each sequence's cache lost this step (per KV head,
    compacted to the front of its slots): the engine shrinks its block table accordingly.
    """

    duration_s: float
    next_token_ids: list[int] | None = None
    evicted_tokens: dict[int, int] | None = None  # seq id -> K/V entries a press evicted this step


class Executor(Protocol):
    def execute(self, batch: ScheduledBatch) -> ExecutionResult: ...


@dataclass
class ToyExecutor:
    """A linear cost model: ``step_s + prefill_token_s * prefill tokens + decode_token_s * decodes``.

    Returns no tokens. Handy to test schedulers with a ``VirtualClock``.
    """

    step_s: float = 0.005
    prefill_token_s: float = 0.0005
    decode_token_s: float = 0.001

    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        duration_s = (
            self.step_s
            + self.prefill_token_s * batch.num_prefill_tokens
            + self.decode_token_s * batch.num_decode_tokens
        )
        return ExecutionResult(duration_s=duration_s, next_token_ids=None)
