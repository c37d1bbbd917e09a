"""How a request picks its next token: ``SamplingParams`` (no torch; the engine carries it on the sequence).

The fields and their meaning follow vLLM's ``SamplingParams`` (v0.11): ``temperature == 0`` is greedy
(``argmax``, what ``Engine.add_request`` does when no parameters are given); otherwise the token is drawn
from ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens and the ``top_p``
nucleus (after ``min_p``: tokens below ``min_p`` times the top probability dropped), with a generator
seeded by ``seed`` per request, so a request with a seed is reproducible. Before that, in vLLM's order,
the logits are changed by ``logit_bias`` (added), ``min_tokens`` (the EOS token and
``stop_token_ids`` are impossible until that many tokens came) and the penalties (``repetition_penalty``: a
token already in the prompt or the output has a positive logit divided, a negative one multiplied, by it;
``frequency_penalty`` times the token's count in the output and ``presence_penalty`` once if it occurs are
subtracted). Greedy requests see the changed logits too.

``logprobs`` (k >= 0) asks for the log-probability of each sampled token and the ``k`` most likely ones;
``prompt_logprobs`` (k >= 0) the same for every prompt token after the first (the executor then computes
the logits of every prompt row). Both are of the model's raw distribution (vLLM's default
``logprobs_mode="raw_logprobs"``): before the bias, penalties, temperature and truncation. The sampling itself
runs inside the executor that has the logits (``longctx.engine.sampler``, torch), as in nano-vllm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (and OpenAI's top_logprobs limit)


def _check_range(name: str, value, low: float, high: float, low_open: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float)
    ok = ok and (low < value if low_open else low <= value) and value <= high
    if not ok:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value!r}")


def _check_count(name: str, value, high: int | None = None) -> None:
    if value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, int) or value < 0
            or (high is not None and value > high)):
        allowed = f"an integer in [0, {high}]" if high is not None else "an integer >= 0"
        raise ValueError(f"{name} must be {allowed} or None, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` in [0, 2] (0: greedy), ``top_p`` in (0, 1], ``top_k`` (0: all tokens), ``seed``: the
    request's generator seed; the logit changes and log-probabilities described in the module docstring."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    top_k: int = 0
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one (vLLM's min_p)
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict, hash=False)
    stop_token_ids: tuple[int, ...] = ()  # besides EOS, masked too until min_tokens came (vLLM)
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        _check_range("temperature", self.temperature, 0.0, 2.0)
        _check_range("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if isinstance(self.seed, bool) or int(self.seed) != self.seed:
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed must fit a 64-bit signed integer (as vLLM's), got {self.seed}")
        _check_count("top_k", self.top_k)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_count("min_tokens", self.min_tokens)
        _check_range("repetition_penalty", self.repetition_penalty, 0.0, float("inf"), low_open=True)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        for token, bias in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            _check_range(f"logit_bias[{token}]", bias, -100.0, 100.0)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be token ids (integers >= 0), got {self.stop_token_ids!r}")
        _check_count("logprobs", self.logprobs, MAX_LOGPROBS)
        _check_count("prompt_logprobs", self.prompt_logprobs, MAX_LOGPROBS)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def changes_logits(self) -> bool:
        """True when the logits are changed before the choice (bias, minimum length, penalties)."""
        return bool(self.logit_bias or self.min_tokens or self.repetition_penalty != 1.0
                    or self.frequency_penalty or self.presence_penalty)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy on the raw logits with no log-probabilities asked: the batch's ``argmax`` is the answer."""
        return self.greedy and not self.changes_logits and self.logprobs is None
