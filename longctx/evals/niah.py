"""Needle in a haystack on our own model: one trial = one prefill, scored two ways; a grid of trials.

A trial feeds ``prompt + answer[:-1]`` (``P + m - 1`` tokens) through the model in ONE prefill over a paged
KV cache and reads the logits of the ``m`` rows that predict the answer tokens (teacher forcing,
``longctx.evals.forcing``):

- ``answer_logprob`` = sum over the answer's tokens of log p(token | everything before it), in nats: a
  continuous score, informative even when the greedy answer is wrong;
- ``correct``: greedy decoding reproduces the answer, i.e. the argmax of each of those rows is the answer's
  token. When it is not, decoding continues greedily from the first wrong token (a few decode steps on the
  same cache) so that ``output`` shows what the model did say.

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
from dataclasses import asdict, dataclass

from longctx.evals.forcing import forced_logits
from longctx.evals.haystack import HaystackBuilder, NeedlePrompt
from longctx.evals.table import NiahTable

TRAINED_CONTEXT = 8192  # SmolLM2-135M's training length (its GGUF's llama.context_length)


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
        if int(max_tokens) != max_tokens or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.model, self.tok = model, tokenizer
        self.block_size = int(block_size)
        self.num_blocks = -(-int(max_tokens) // self.block_size)
        self.builder = builder or HaystackBuilder(tokenizer)
        self._cache = None
        self.press, self.question_aware = press, bool(question_aware)
        if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        self.kv_dtype, self.chunk_size = kv_dtype, chunk_size
        if kv_dtype is not None:
            from longctx.kv.quant import get_format

            get_format(kv_dtype)  # a bad name fails here, not at the first trial

    @property
    def press_label(self) -> str:
        if self.press is None:
            return "none"
        return f"{self.press.name} {self.press.compression_ratio:g}" + ("" if self.question_aware else " agnostic")

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
            self._table = list(range(self.num_blocks))
            self._torch = torch
        return self._cache

    def _forward(self, ids: list[int], slot: int, rows: list[int], position: int | None = None):
        from longctx.evals.forcing import forward_at

        return forward_at(self.model, self._cache, self._table, ids, slot, rows, position, self.block_size)

    def score(self, prompt: NeedlePrompt, extra_tokens: int = 4) -> tuple[bool, float, list[int], float]:
        """``(correct, answer_logprob, output_ids, prefill_s)`` for one prompt (see the module docstring)."""
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
        logits, cached = forced_logits(self.model, self._cache, self._table, prompt.token_ids, ans, self.press,
                                       split, self.block_size, self.chunk_size)  # [m, vocab]
        prefill_s = time.perf_counter() - t0
        logp = self._torch.log_softmax(logits, dim=-1)
        answer_logprob = float(sum(logp[i, t] for i, t in enumerate(ans)))
        greedy = logits.argmax(-1).tolist()
        j = next((i for i in range(m) if greedy[i] != ans[i]), m)
        if j == m:
            return True, answer_logprob, ans, prefill_s
        output = ans[:j] + [greedy[j]]  # the first wrong token, then greedy decoding from there
        slot, pos = cached + j, P + j  # cache slot and position differ once a press evicted tokens
        for _ in range(m - j - 1 + extra_tokens):
            if output[-1] == self.tok.eos_token_id:
                break
            output.append(int(self._forward([output[-1]], slot, [0], position=pos).argmax(-1)))
            slot, pos = slot + 1, pos + 1
        return False, answer_logprob, output, prefill_s

    def trial(self, length: int, depth: float, seed: int = 0, haystack: str = "passkey") -> NiahTrial:
        prompt = self.builder.build(length, depth, seed, haystack)
        correct, lp, out_ids, prefill_s = self.score(prompt)
        text = self.tok.decode(out_ids).strip()
        return NiahTrial(haystack, rope_label(self.model.rope_scaling), prompt.length, float(depth),
                         int(seed), prompt.needle_start, bool(correct), lp, prompt.answer, text, prefill_s,
                         self.press_label)


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
