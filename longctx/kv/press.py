"""KV-cache pruning ("presses", after NVIDIA's kvpress): which prompt tokens each KV head keeps.

A press looks at one layer of one sequence's prompt (``PressInput``: its keys, values and, when the press
needs them, some queries) and returns an importance per (KV head, token): ``score``, the one method a new
press writes. The base class does the rest, the same for every press:

    kept = T - floor(compression_ratio * T)          tokens per KV head (at least the protected ones)
    keep_indices = top-kept of score per head, protected tokens first, then sorted by position

Every KV head keeps the same number of tokens (so a compacted layer is a ``[H_kv, kept, d]`` tensor, and
the paged pool frees whole blocks), but each head chooses its own tokens. Keys are stored after RoPE, so
a kept key keeps its original position; later tokens keep theirs too.

Presses (``PRESSES``, by CLI name):
- ``streaming_llm``: StreamingLLM (Xiao et al. 2023, arXiv 2309.17453): ``n_sink`` first tokens (4, as in
  the paper) and the most recent ones. The paper re-assigns positions inside the cache (a kept token's
  position is its slot); here every kept key keeps its original position.
- ``snapkv``: SnapKV (Li et al. 2024, arXiv 2404.14469): attention of the last ``window_size`` prompt
  queries (the observation window, always kept), averaged over the window and the query heads of each
  GQA group, smoothed by 1-D average pooling (``kernel_size``). Averaging over the GQA group is kvpress's
  choice (SnapKV's own code repeats K/V to every query head and selects per query head; its issue #22
  asks how groups are handled). Pooling here runs over all ``T`` keys, the window's own included, and
  averages only real neighbours at the ends (``count_include_pad=False``); SnapKV and kvpress pool over
  the keys before the window, with zero padding counted at the ends.
- ``h2o``: H2O (Zhang et al. 2023, arXiv 2306.14048): attention accumulated over every prompt query
  ("heavy hitters"), plus a recent window of ``recent_fraction`` of the kept budget. One-shot: it prunes
  once after the prefill, where the paper evicts greedily, one token per decoding step. ``normalization``
  ``"mean"`` divides each key's sum by the queries that see it, as kvpress's ObservedAttentionPress does.
- ``random`` (one seeded generator per press, fresh draws per layer and prompt) and ``knorm`` (keys with
  a small L2 norm matter more: Devoto et al. 2024, arXiv 2406.11430): baselines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from longctx.checks import eviction_fraction, positive_int
from longctx.memory import evicted_tokens
from longctx.model.attention import attention_weights  # the one causal softmax (re-exported for lesson 06)


@dataclass
class PressInput:
    """One layer of one sequence's prompt. ``keys``/``values``: ``[H_kv, T, d]`` (keys after RoPE).

    ``queries``: ``[H, n, d]`` after RoPE, the last ``n`` prompt queries (positions ``T - n … T - 1``), for a
    press with a ``query_window``. ``attention_sum``: ``[H, T]``, the causal attention weights of every
    prompt query summed per key, for a press that ``uses_attention_sum`` (the engine accumulates it chunk
    by chunk; without it the press computes it from ``queries``, which must then be all ``T``).
    ``H`` is a multiple of ``H_kv`` (GQA)."""

    keys: torch.Tensor
    values: torch.Tensor
    queries: torch.Tensor | None = None
    attention_sum: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.keys.dim() != 3 or self.keys.shape != self.values.shape:
            raise ValueError(f"keys and values must both be [H_kv, T, d]; got {tuple(self.keys.shape)} and "
                             f"{tuple(self.values.shape)}")
        H_kv, T, d = self.keys.shape
        if self.queries is not None:
            q = self.queries
            if q.dim() != 3 or q.shape[-1] != d or q.shape[0] % H_kv:
                raise ValueError(f"queries must be [H, n, d] with H a multiple of H_kv = {H_kv} "
                                 f"and d = {d}; got {tuple(q.shape)}")
            if q.shape[1] > T:
                raise ValueError(f"{q.shape[1]} queries but only {T} prompt tokens")
        if self.attention_sum is not None:
            a = self.attention_sum
            if a.dim() != 2 or a.shape[1] != T or a.shape[0] % H_kv:
                raise ValueError(f"attention_sum must be [H, T = {T}] with H a multiple of {H_kv}; "
                                 f"got {tuple(a.shape)}")

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[1]


def per_kv_head(scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[H, T]`` scores of query heads -> ``[H_kv, T]``: the mean over each GQA group."""
    H, T = scores.shape
    return scores.view(num_kv_heads, H // num_kv_heads, T).mean(dim=1)


class Press:
    """Keeps the top ``T - floor(compression_ratio * T)`` tokens of ``score`` per KV head.

    Subclasses write ``score(inp) -> [H_kv, T]`` (higher: more important) and, when some tokens must
    always stay, ``protected(num_tokens, num_kept) -> bool [T]``. What ``score`` reads besides keys and
    values is declared, so the engine collects only that during the prefill: ``query_window`` (the last
    prompt queries, ``PressInput.queries``) and ``uses_attention_sum`` (``PressInput.attention_sum``).
    ``check_prompt(T)`` refuses a prompt the press cannot handle (the engine calls it on admission)."""

    name: ClassVar[str] = "none"
    query_window: int = 0
    uses_attention_sum: bool = False
    rolling: bool = False  # also keeps its budget during decode (the engine evicts a block at a time)
    n_sink: int = 0  # first tokens a rolling press never evicts (the oldest block after them goes)

    def __init__(self, compression_ratio: float = 0.0) -> None:
        self.compression_ratio = eviction_fraction("compression_ratio", compression_ratio)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(compression_ratio={self.compression_ratio:g})"

    def check_prompt(self, num_tokens: int) -> None:
        if num_tokens < 1:
            raise ValueError("a press needs a prompt of at least one token")

    def score(self, inp: PressInput) -> torch.Tensor:
        raise NotImplementedError

    def protected(self, num_tokens: int, num_kept: int) -> torch.Tensor:
        return torch.zeros(num_tokens, dtype=torch.bool)

    def num_kept(self, num_tokens: int) -> int:
        """Tokens each KV head keeps of a ``num_tokens`` prompt: ``T - floor(ratio * T)``, at least the
        protected."""
        kept = num_tokens - evicted_tokens(num_tokens, self.compression_ratio)
        return max(kept, int(self.protected(num_tokens, kept).sum()))

    def keep_indices(self, inp: PressInput) -> torch.Tensor:
        """``[H_kv, kept]`` positions each KV head keeps, ascending (protected tokens always among them)."""
        T = inp.num_tokens
        self.check_prompt(T)
        kept = self.num_kept(T)
        if kept >= T:
            return torch.arange(T, device=inp.keys.device).expand(inp.keys.shape[0], T).clone()
        scores = self.score(inp).float().to(inp.keys.device)
        if scores.shape != (inp.keys.shape[0], T):
            raise ValueError(f"{type(self).__name__}.score returned {tuple(scores.shape)}, expected "
                             f"[H_kv, T] = {(inp.keys.shape[0], T)}")
        scores = scores.masked_fill(self.protected(T, kept).to(scores.device)[None, :], float("inf"))
        return scores.topk(kept, dim=-1).indices.sort(dim=-1).values


def compact(tensor: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``tensor`` [H_kv, T, d] cut to each head's kept tokens ``keep`` [H_kv, kept] -> [H_kv, kept, d]."""
    return tensor.gather(1, keep[:, :, None].expand(-1, -1, tensor.shape[-1]))


class StreamingLLMPress(Press):
    """The first ``n_sink`` tokens (attention sinks) and the most recent ones."""

    name = "streaming_llm"
    rolling = True

    def __init__(self, compression_ratio: float = 0.0, n_sink: int = 4) -> None:
        super().__init__(compression_ratio)
        if isinstance(n_sink, bool) or int(n_sink) != n_sink or n_sink < 0:
            raise ValueError(f"n_sink must be an integer >= 0, got {n_sink!r}")
        self.n_sink = int(n_sink)

    def score(self, inp):
        return torch.arange(inp.num_tokens, dtype=torch.float32,
                            device=inp.keys.device).expand(inp.keys.shape[0], -1)

    def protected(self, num_tokens, num_kept):
        mask = torch.zeros(num_tokens, dtype=torch.bool)
        mask[: self.n_sink] = True
        return mask


class SnapKVPress(Press):
    """Pooled attention of the observation window (the last ``window_size`` prompt queries, kept)."""

    name = "snapkv"

    def __init__(self, compression_ratio: float = 0.0, window_size: int = 32, kernel_size: int = 5) -> None:
        super().__init__(compression_ratio)
        self.window_size = positive_int("window_size", window_size)
        self.kernel_size = positive_int("kernel_size", kernel_size, what="an odd positive integer")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be an odd positive integer, got {kernel_size!r}")

    @property
    def query_window(self) -> int:
        return self.window_size

    def check_prompt(self, num_tokens):
        super().check_prompt(num_tokens)
        if self.window_size > num_tokens:
            raise ValueError(f"SnapKV's window ({self.window_size} tokens) is larger than the prompt "
                             f"({num_tokens} tokens); use window_size <= {num_tokens}")

    def score(self, inp):
        if inp.queries is None or inp.queries.shape[1] != self.window_size:
            raise ValueError(f"SnapKV needs the last {self.window_size} prompt queries in PressInput.queries")
        weights = attention_weights(inp.queries, inp.keys).mean(dim=1)  # [H, T]
        pooled = F.avg_pool1d(weights[:, None, :], self.kernel_size, stride=1, padding=self.kernel_size // 2,
                              count_include_pad=False)[:, 0]  # [H, T]
        return per_kv_head(pooled, inp.keys.shape[0])

    def protected(self, num_tokens, num_kept):
        mask = torch.zeros(num_tokens, dtype=torch.bool)
        mask[num_tokens - min(self.window_size, num_tokens):] = True
        return mask


class H2OPress(Press):
    """Heavy hitters (attention summed over every prompt query) and a recent window.

    ``normalization="sum"``: a key's score is its attention column summed over the prompt's queries (H2O's
    accumulated attention). Key ``j`` is seen by the ``T - j`` queries at or after it, so early keys collect
    more terms and the raw sum favours them. ``"mean"`` divides by that count: the average attention a key
    receives from the queries that see it, which is how kvpress's ObservedAttentionPress scores keys."""

    name = "h2o"
    uses_attention_sum = True
    NORMALIZATIONS = ("sum", "mean")

    def __init__(self, compression_ratio: float = 0.0, recent_fraction: float = 0.5,
                 normalization: str = "sum") -> None:
        super().__init__(compression_ratio)
        if not 0.0 <= float(recent_fraction) <= 1.0:
            raise ValueError(f"recent_fraction must be in [0, 1], got {recent_fraction!r}")
        if normalization not in self.NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {self.NORMALIZATIONS}, got {normalization!r}")
        self.recent_fraction, self.normalization = float(recent_fraction), normalization

    def score(self, inp):
        total = inp.attention_sum
        if total is None:
            if inp.queries is None or inp.queries.shape[1] != inp.num_tokens:
                raise ValueError("H2O needs PressInput.attention_sum, "
                                 "or every prompt query in PressInput.queries")
            total = attention_weights(inp.queries, inp.keys).sum(dim=1)  # [H, T]
        total = total.float()
        if self.normalization == "mean":  # key j is seen by the T - j queries at positions j … T - 1
            total = total / torch.arange(inp.num_tokens, 0, -1, dtype=torch.float32, device=total.device)
        return per_kv_head(total, inp.keys.shape[0])

    def protected(self, num_tokens, num_kept):
        mask = torch.zeros(num_tokens, dtype=torch.bool)
        mask[num_tokens - round(self.recent_fraction * num_kept):] = True  # recent 0: the empty slice [T:]
        return mask


class RandomPress(Press):
    """Uniform random scores (the floor any policy must beat), drawn afresh for every layer and every prompt.

    One ``torch.Generator`` per press, seeded once here and advanced by each ``score`` call: the layers of
    one prompt, and successive prompts, get independent draws; two presses with the same seed repeat the
    same sequence of draws. (A generator re-seeded inside ``score`` would evict the same positions in every
    layer and every trial.)"""

    name = "random"

    def __init__(self, compression_ratio: float = 0.0, seed: int = 0) -> None:
        super().__init__(compression_ratio)
        self.seed = int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def score(self, inp):
        return torch.rand(inp.keys.shape[0], inp.num_tokens, generator=self.generator)


class KnormPress(Press):
    """Keys with a small L2 norm are kept (score = -||k||)."""

    name = "knorm"

    def score(self, inp):
        return -inp.keys.float().norm(dim=-1)  # [H_kv, T]


PRESSES: dict[str, type[Press]] = {p.name: p for p in (StreamingLLMPress, SnapKVPress, H2OPress, RandomPress,
                                                         KnormPress)}


def make_press(name: str, compression_ratio: float = 0.0, **options) -> Press:
    """The press called ``name`` (``PRESSES``' keys) at ``compression_ratio``, with its own options."""
    if name not in PRESSES:
        raise ValueError(f"unknown press {name!r}; allowed: {', '.join(PRESSES)}")
    return PRESSES[name](compression_ratio, **options)
