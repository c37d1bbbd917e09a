"""The executor protocol: run a ``ScheduledBatch``, report how long it took and the sampled tokens.

``Executor`` is the base class every executor subclasses; the engine calls nothing else:

    executor.block_manager            # its own KV pool, or None (the engine then makes or takes one)
    executor.check_prompt(n)          # on admission: refuse a prompt it cannot run (ValueError)
    executor.execute(batch)           # every step -> ExecutionResult
    executor.forget(seq_id)           # a sequence finished or was aborted: drop its per-request state

Only ``execute`` must be written; the others default to "no pool of my own, accept every prompt, keep no
state". Implementations: ``TorchExecutor`` (``longctx.engine.torch_executor``, the real model on the paged
KV cache, which also samples each sequence's tokens with its ``SamplingParams``, as nano-vllm's model
runner does), the cost model (``longctx.sim.cost_model``) and ``ToyExecutor`` here (a linear cost model
with dummy tokens, for tests and examples: no torch).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from longctx.engine.batch import ScheduledBatch
from longctx.kv.block_manager import BlockManager


@dataclass(frozen=True)
class ExecutionResult:
    """``duration_s``: how long the step took (measured or modelled).

    ``next_token_ids``: one token id per batch entry, in ``batch.entries`` order; only the entries that
    reach the end of their sequence (all its tokens computed) use theirs. ``None`` when the executor produces
    no real tokens (a cost model): the engine then appends a dummy token and stops by ``max_tokens`` only.

    ``evicted_tokens``: for KV pruning, the entries each sequence's cache lost this step (per KV head,
    compacted to the front of its slots): the engine shrinks its block table accordingly.
    """

    duration_s: float
    next_token_ids: list[int] | None = None
    evicted_tokens: dict[int, int] | None = None  # seq id -> K/V entries a press evicted this step


class Executor(abc.ABC):
    """Base class of every executor: write ``execute``; override the others when the executor needs them."""

    #: The KV pool whose tensors this executor owns (``TorchExecutor``), or None for an executor without a
    #: cache of its own (a cost model). The engine uses this pool when it is set.
    block_manager: BlockManager | None = None

    @abc.abstractmethod
    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        """Run (or model) one step; read the batch before the engine updates its sequences."""

    def check_prompt(self, num_tokens: int) -> None:  # noqa: B027 (a default that accepts: deliberate)
        """Raise ``ValueError`` for a prompt of ``num_tokens`` this executor cannot run (default: accept)."""

    def forget(self, seq_id: int) -> None:  # noqa: B027
        """Drop what this executor keeps for ``seq_id`` (it finished or was aborted; default: nothing)."""


@dataclass
class ToyExecutor(Executor):
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
