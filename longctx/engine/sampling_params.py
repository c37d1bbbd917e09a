"""How a request picks its next token: ``SamplingParams`` (no torch; the engine carries it on the sequence).

``temperature == 0`` is greedy (``argmax``, what ``Engine.add_request`` does when no parameters are given);
otherwise the token is drawn from ``softmax(logits / temperature)`` restricted to the top-p nucleus, with a
generator seeded by ``seed`` per request, so a request with a seed is reproducible. The sampling itself runs
inside the executor that has the logits (``longctx.engine.sampler``, torch), as in nano-vllm.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` in [0, 2] (0: greedy), ``top_p`` in (0, 1], ``seed``: the request's generator seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature!r}")
        if isinstance(self.top_p, bool) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.seed, bool) or int(self.seed) != self.seed:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
