"""Per-request sampling on top of the engine's ``TorchExecutor``.

The engine's executor is greedy (``argmax``). A server must also honour ``temperature`` (and ``top_p``), with
a seeded generator per request so that a request with a ``seed`` is reproducible. ``SamplingExecutor`` wraps
a ``TorchExecutor``: it runs the same forward pass (``TorchExecutor._run(batch)`` -> logits
``[len(batch), vocab]`` of the last new token of every entry) and, for the entries that produce a token this
step (``entry.completes_prefill``), samples from ``softmax(logits / temperature)`` restricted to the top-p
nucleus. ``temperature == 0`` (or a request with no parameters registered) stays greedy, bit-identical to
``TorchExecutor``.

Only the engine thread calls ``execute``; ``register`` / ``forget`` are called from that thread too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from longctx.engine.executor import ExecutionResult


@dataclass
class SamplingParams:
    """``temperature`` >= 0 (0: greedy), ``0 < top_p <= 1``, ``seed``: the request's generator seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from ``logits`` ``[vocab]``: greedy, or temperature + top-p (nucleus) sampling."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # the smallest set reaching top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


def _samples_now(entry) -> bool:
    """True when this batch entry reaches the end of its sequence, so the step samples a token for it."""
    done = getattr(entry, "completes_prefill", None)
    if done is not None:
        return bool(done)
    return entry.num_tokens == entry.seq.num_uncomputed_tokens


class SamplingExecutor:
    """A ``TorchExecutor`` whose token choice follows each request's ``SamplingParams``."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self._params: dict[int, tuple[SamplingParams, torch.Generator]] = {}

    def __getattr__(self, name):  # everything else (block_manager, cache, model, ...) is the inner executor's
        return getattr(self.inner, name)

    def register(self, seq_id: int, params: SamplingParams) -> None:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(int(params.seed))
        self._params[seq_id] = (params, gen)

    def forget(self, seq_id: int) -> None:
        self._params.pop(seq_id, None)

    def execute(self, batch) -> ExecutionResult:
        t0 = time.perf_counter()
        logits = self.inner._run(batch)  # [len(batch), vocab]
        next_ids = logits.argmax(dim=-1).tolist()
        for i, entry in enumerate(batch.entries):
            got = self._params.get(entry.seq.seq_id)
            if got is not None and not got[0].greedy and _samples_now(entry):
                next_ids[i] = sample_token(logits[i].cpu(), got[0], got[1])
        return ExecutionResult(duration_s=time.perf_counter() - t0, next_token_ids=next_ids)
