"""Sampling inside the executor (torch): each entry's next token from the step's logits.

``Sampler`` is what ``TorchExecutor`` calls after the forward pass: the greedy token (``argmax``) for every
entry, then, for each entry that produces a token this step and whose sequence carries non-greedy
``SamplingParams`` (``longctx.engine.sampling_params``), a draw from ``softmax(logits / temperature)`` over the
top-p nucleus with that sequence's own seeded generator (created on its first draw, advanced by each one,
dropped by ``forget``). Greedy requests stay bit-identical to plain ``argmax``.
"""

from __future__ import annotations

import torch

from longctx.engine.sampling_params import SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from ``logits`` ``[vocab]``: greedy, or temperature + top-p (nucleus) sampling."""
    if params.greedy:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [vocab]
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # the smallest set reaching top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


class Sampler:
    """Per-sequence seeded generators, and the choice of every entry's next token."""

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, batch) -> list[int]:
        """``logits`` ``[len(batch), vocab]`` (the last new token of each entry) -> one token id per entry."""
        next_ids = logits.argmax(dim=-1).tolist()  # .tolist() waits for the device
        for i, entry in enumerate(batch.entries):
            params = entry.seq.sampling
            if params is not None and not params.greedy and entry.completes_prefill:
                next_ids[i] = sample_token(logits[i].cpu(), params, self._generator(entry.seq.seq_id, params))
        return next_ids

    def _generator(self, seq_id: int, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = self._generators[seq_id] = torch.Generator(device="cpu")
            gen.manual_seed(int(params.seed))
        return gen

    def forget(self, seq_id: int) -> None:
        self._generators.pop(seq_id, None)
