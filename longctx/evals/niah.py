"""Needle in a haystack on our own model: one trial = one prefill, scored two ways; a grid of trials.

A trial feeds ``prompt + answer[:-1]`` (``P + m - 1`` tokens) through the model in ONE prefill over a paged
KV cache and reads the logits of the ``m`` rows that predict the answer tokens (teacher forcing,
``longctx.evals.forcing``):

- ``answer_logprob`` = sum over the answer's tokens of log p(token | everything before it), in nats: a
  continuous score, informative even when the greedy answer is wrong (``answer_token_logprobs`` keeps each
  token's share and ``forced_top`` the model's own top token there: where the answer breaks);
- ``correct``: the greedy answer contains the needle's value as a whole number
  (``longctx.evals.scoring.contains_answer``; ``"71432".`` counts). The greedy answer agrees with the forced
  rows up to their first wrong token, and decoding continues on the same cache from there (or after the
  answer) until the value stands closed in the text, the turn ends, or ``len(answer) + 16`` tokens: enough
  for an answer in quotes or one that restates "The pass key is" first. ``exact`` keeps the older, stricter
  rule (the first greedy tokens are exactly the answer's).

With a KV press (``NiahRunner(..., press=...)``, ``longctx.kv.press``) a trial is three passes instead: the
prompt is prefilled and pruned (question-aware: the question is inside the prompt, so SnapKV's window sees
it), or the context alone is prefilled and pruned before the question is (question-agnostic: what a cache
shared by many questions must do); then the answer is teacher-forced over the pruned cache.

``run_grid`` runs lengths x depths x seeds with a tqdm bar and returns a ``NiahTable`` (tidy rows that save
to / load from JSON). Prompts come from ``longctx.evals.haystack``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

from longctx.checks import positive_int
from longctx.evals.forcing import forced_logits
from longctx.evals.haystack import HaystackBuilder, NeedlePrompt
from longctx.evals.scoring import answer_closed, contains_answer
from longctx.evals.table import NiahTable
from longctx.memory import blocks_for_tokens

TRAINED_CONTEXT = 8192  # SmolLM2-135M's training length (its GGUF's llama.context_length)
DECODE_EXTRA_TOKENS = 16  # greedy tokens beyond the answer's length: room for quotes or a restated prefix


@dataclass(frozen=True)
class NiahTrial:
    """One scored trial (a row of the table). ``length`` is the real prompt length in tokens."""

    haystack: str
    rope: str  # "none" or the rope_scaling's rope_type and factor, e.g. "yarn x2"
    length: int
    depth: float
    seed: int
    needle_start: int
    correct: bool
    answer_logprob: float  # nats, summed over the answer tokens
    answer: str
    output: str
    prefill_s: float
    press: str = "none"  # e.g. "snapkv 0.5" (question-aware) or "snapkv 0.5 agnostic"
    exact: bool = False  # the old rule: the greedy tokens after the prefix are exactly the answer's
    answer_token_logprobs: list = field(default_factory=list)  # nats, one per answer token
    forced_top: list = field(default_factory=list)  # the model's top token at each answer position
    decode_s: float = 0.0
    needle_len: int = 0
    breaks_at: int = -1  # the first answer token the forced rows get wrong (-1: none)

    def to_dict(self) -> dict:
        return asdict(self)


def rope_label(scaling: dict | None) -> str:
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return "none"
    return f"{scaling.get('rope_type', scaling.get('type'))} x{float(scaling['factor']):g}"


class NiahRunner:
    """Runs trials on ``model`` (a ``longctx.model.llama.Llama``) over a KV pool of ``max_tokens`` tokens.

    ``max_tokens`` is the longest ``prompt + answer + extra decode`` the pool holds; a longer trial is a
    ``ValueError`` (nothing is allocated for it). Use ``model.rope_scaling`` to run with a RoPE extension.
    ``kv_dtype`` stores the pool quantized (``longctx.kv.quant``) and ``chunk_size`` prefills the prompt in
    chunks (then the answer runs over the cache), so the needle is read back through the quantized keys.
    """

    def __init__(self, model, tokenizer, max_tokens: int = TRAINED_CONTEXT + 64, block_size: int = 16,
                 builder: HaystackBuilder | None = None, press=None, question_aware: bool = True,
                 kv_dtype: str | None = None, chunk_size: int | None = None) -> None:
        positive_int("max_tokens", max_tokens)
        self.model, self.tok = model, tokenizer
        if press is not None and model.config.is_hybrid:
            raise ValueError(f"KV presses are not supported on {model.config.name} (sliding-window layers)")
        self.block_size = int(block_size)
        self.num_blocks = blocks_for_tokens(int(max_tokens), self.block_size)
        self.builder = builder or HaystackBuilder(tokenizer)
        self._cache = None
        self.press, self.question_aware = press, bool(question_aware)
        positive_int("chunk_size", chunk_size, allow_none=True)
        self.kv_dtype, self.chunk_size = kv_dtype, chunk_size
        if kv_dtype is not None:
            from longctx.kv.quant import get_format

            get_format(kv_dtype)  # a bad name fails here, not at the first trial

    @property
    def press_label(self) -> str:
        if self.press is None:
            return "none"
        return f"{self.press.name} {self.press.compression_ratio:g}" + (
            "" if self.question_aware else " agnostic"
        )

    @property
    def max_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def _kv(self):
        if self._cache is None:  # allocated on first use, reused by every trial (positions overwrite)
            import torch

            from longctx.kv.cache import PagedKVCache

            p = next(self.model.parameters())
            self._cache = PagedKVCache.for_model(
                self.model.config, self.num_blocks, self.block_size, p.device, p.dtype, self.kv_dtype
            )
            from longctx.model.attention import choose_backend  # re-chosen knowing the pool

            self.model.attention_backend = choose_backend(
                self.model.attention_backend.requested, p.device, p.dtype, self._cache.format is None)
            self._table = list(range(self.num_blocks))
            self._torch = torch
        return self._cache

    def _forward(self, ids: list[int], slot: int, rows: list[int], position: int | None = None):
        from longctx.evals.forcing import forward_at

        return forward_at(self.model, self._cache, self._table, ids, slot, rows, position, self.block_size)

    def score(self, prompt: NeedlePrompt, extra_tokens: int = DECODE_EXTRA_TOKENS) -> AnswerReading:
        """The ``AnswerReading`` of one prompt (see the module docstring): teacher-forced answer, then
        greedy decoding of up to ``len(answer) + extra_tokens`` tokens from the answer prefix."""
        P, ans = len(prompt.token_ids), list(prompt.answer_ids)
        m = len(ans)
        need = P + m + extra_tokens
        if need > self.max_tokens:
            raise ValueError(
                f"a {P}-token prompt plus its {m}-token answer and {extra_tokens} extra decode tokens needs "
                f"{need} KV slots but the pool holds {self.max_tokens} (num_blocks={self.num_blocks} x "
                f"block_size={self.block_size}); build the runner with max_tokens >= {need}"
            )
        self._kv()
        t0 = time.perf_counter()
        split = None if self.question_aware or prompt.question_start < 1 else prompt.question_start
        logits, cached = forced_logits(
            self.model, self._cache, self._table, prompt.token_ids, ans, self.press, split, self.block_size,
            self.chunk_size,
        )  # [m, vocab]
        prefill_s = time.perf_counter() - t0

        def next_token(token: int, k: int) -> int:  # output token k at slot cached + k, position P + k
            return int(self._forward([token], cached + k, [0], position=P + k).argmax(-1))

        return read_answer(logits, prompt, next_token, self.tok, m + extra_tokens, prefill_s)

    def trial(self, length: int, depth: float, seed: int = 0, haystack: str = "passkey") -> NiahTrial:
        prompt = self.builder.build(length, depth, seed, haystack)
        r = self.score(prompt)
        return NiahTrial(
            haystack, rope_label(self.model.rope_scaling), prompt.length, float(depth), int(seed),
            prompt.needle_start, r.correct, r.answer_logprob, prompt.answer, r.output, r.prefill_s,
            self.press_label, r.exact, r.token_logprobs, [self.tok.decode([t]) for t in r.forced_top],
            r.decode_s, prompt.needle_len, r.breaks_at,
        )


@dataclass(frozen=True)
class AnswerReading:
    """What one trial's logits and greedy continuation say. ``token_logprobs[i]``: log p(answer token i)
    under teacher forcing (nats); ``forced_top[i]``: the model's top token there (where the answer breaks);
    ``output``: the greedy continuation of the answer prefix, decoded and stripped."""

    correct: bool  # contains_answer(output, answer)
    exact: bool  # the greedy tokens right after the prefix are exactly the answer's (the old rule)
    answer_logprob: float
    token_logprobs: list[float]
    forced_top: list[int]
    output_ids: list[int]
    output: str
    prefill_s: float
    decode_s: float

    breaks_at: int = -1  # the first answer token whose forced row prefers another token (-1: none)


class GreedyAnswer:
    """The greedy answer of one trial, extended a token at a time (so many trials can decode in one batch).

    Built from the teacher-forced ``logits`` [m, vocab]: the greedy output agrees with the forced rows up
    to their first wrong token. ``done`` once the answer stands as a closed whole number (the verdict cannot
    change), the turn ends, or ``max_new_tokens`` are out; until then ``push`` the argmax after
    ``output_ids[-1]``, which sits at output index ``len(output_ids) - 1``."""

    def __init__(self, logits, prompt: NeedlePrompt, tok, max_new_tokens: int) -> None:
        import torch

        self.prompt, self.tok, self.max_new_tokens = prompt, tok, int(max_new_tokens)
        ans = list(prompt.answer_ids)
        m = len(ans)
        logp = torch.log_softmax(logits.float(), dim=-1)
        self.token_logprobs = [float(logp[i, t]) for i, t in enumerate(ans)]
        self.forced_top = logits.argmax(-1).tolist()
        j = next((i for i in range(m) if self.forced_top[i] != ans[i]), m)
        self.exact, self.breaks_at = j == m, (j if j < m else -1)
        self.output_ids = ans[:j] + ([self.forced_top[j]] if j < m else [])
        self._t0 = time.perf_counter()

    @property
    def done(self) -> bool:
        out = self.output_ids
        return (len(out) >= self.max_new_tokens or out[-1] == self.tok.eos_token_id
                or answer_closed(self.tok.decode(out), self.prompt.answer))

    def push(self, token: int) -> None:
        self.output_ids.append(int(token))

    def reading(self, prefill_s: float = 0.0) -> AnswerReading:
        text = self.tok.decode([t for t in self.output_ids if t != self.tok.eos_token_id]).strip()
        return AnswerReading(contains_answer(text, self.prompt.answer), self.exact, sum(self.token_logprobs),
                             self.token_logprobs, self.forced_top, self.output_ids, text, prefill_s,
                             time.perf_counter() - self._t0, self.breaks_at)


def read_answer(logits, prompt: NeedlePrompt, next_token, tok, max_new_tokens: int,
                prefill_s: float = 0.0) -> AnswerReading:
    """Score the teacher-forced ``logits`` [m, vocab] of ``prompt``'s answer and decode greedily with
    ``next_token(token, k)`` (feed output token ``k``, return the argmax after it) until
    ``GreedyAnswer.done``."""
    g = GreedyAnswer(logits, prompt, tok, max_new_tokens)
    while not g.done:
        g.push(next_token(g.output_ids[-1], len(g.output_ids) - 1))
    return g.reading(prefill_s)


def check_grid(lengths, depths, seeds) -> tuple[list[int], list[float], list[int]]:
    """Validated ``(lengths, depths, seeds)``; ``seeds`` may be a count (``3`` -> ``[0, 1, 2]``)."""
    lengths = [int(n) for n in lengths]
    if not lengths or any(n < 1 for n in lengths):
        raise ValueError(f"lengths must be positive token counts, got {lengths!r}")
    depths = [float(d) for d in depths]
    bad = [d for d in depths if not 0.0 <= d <= 1.0 or math.isnan(d)]
    if not depths or bad:
        raise ValueError(f"depths must be fractions in [0, 1] (0 = start, 1 = end), got {bad or depths!r}")
    seeds = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ValueError("give at least one seed")
    return lengths, depths, seeds


def run_grid(runner: NiahRunner, lengths, depths, seeds=1, haystack: str = "passkey",
             progress: bool = True, table: NiahTable | None = None) -> NiahTable:
    """Every (length, depth, seed) trial, longest lengths last; rows appended to ``table`` (or a new one).

    Lengths are checked against the pool before any trial runs."""
    lengths, depths, seeds = check_grid(lengths, depths, seeds)
    longest = max(lengths)
    if longest + 16 > runner.max_tokens:
        raise ValueError(
            f"length {longest} does not fit the runner's KV pool of {runner.max_tokens} tokens "
            f"(prompt + answer + a few decode tokens); allowed: lengths <= {runner.max_tokens - 16}"
        )
    from tqdm.auto import tqdm

    table = table if table is not None else NiahTable()
    cells = [(n, d, s) for n in sorted(lengths) for d in depths for s in seeds]
    for n, d, s in tqdm(cells, desc=f"niah {haystack}", disable=not progress, leave=False):
        table.append(runner.trial(n, d, s, haystack).to_dict())
    return table
