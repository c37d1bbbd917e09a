"""KV-cache memory: bytes per token, per request, per pool; paged blocks; prefix sharing; capacity.

Every layer stores one key and one value vector per KV head for every token, so::

    kv_bytes_per_token = 2 * L * H_kv * d_head * b          (b = bytes per element of the KV dtype)

(Pope et al. 2022, "Efficiently Scaling Transformer Inference"; GQA: Ainslie et al. 2023.)

Paged cache (vLLM, Kwon et al. 2023): a request holds ``ceil(tokens / block_size)`` blocks of
``block_size`` tokens each, so the last block may be partly empty. Prefix caching shares only *full*
blocks of a common prefix: with paging, ``floor(prefix / block_size)`` blocks are stored once and the
partial block of the prefix is stored by every request. Without paging (``block_size=None``) the whole
prefix is stored once, which is the source's capstone arithmetic.

Hybrid models (Gemma 3: ``ModelSpec.sliding_window_pattern``): a sliding layer never needs more than its
last ``window`` tokens, so a request of ``T`` tokens holds ``T`` tokens in each global layer and
``min(T, window)`` in each sliding one (``kv_bytes_per_request``); paged, a sliding layer holds whole blocks
that cover its window and the tokens being computed (``sliding_blocks_bound``, vLLM's count).

Units: bytes (ints). ``GiB = 2**30`` and ``GB = 1e9`` are the only unit constants; convert explicitly.
Functions accept a ModelSpec or a registered model name.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from longctx.checks import check_token_count  # noqa: F401  (re-exported: memory.check_token_count)
from longctx.specs import ModelSpec, dtype_bytes, get_model

KiB = 2**10
MiB = 2**20
GiB = 2**30
GB = 10**9


def _block_size(block_size: int | None) -> int | None:
    if block_size is None:
        return None
    return check_token_count("block_size", block_size, allow_zero=False)


def _budget(budget_bytes: float) -> float:
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
        raise ValueError(f"budget_bytes must be a number of bytes, got {budget_bytes!r}")
    if not float(budget_bytes) > 0 or float(budget_bytes) == float("inf"):
        raise ValueError(f"budget_bytes must be a finite number > 0 bytes, got {budget_bytes!r}")
    return float(budget_bytes)


def kv_bytes_per_token(model: ModelSpec | str, dtype: str = "fp16", scale_bytes_per_vector: int = 0) -> int:
    """Bytes of K and V for one token over all layers: ``2 * L * H_kv * (d_head * b +
    scale_bytes_per_vector)``.

    The one place this formula is written. With the default ``scale_bytes_per_vector=0`` it counts elements
    only, the textbook number (always whole: for int4, 2 * 0.5 = 1); Llama-2-7B fp16: 524,288 B = 512 KiB.
    A quantized pool also stores scales with each key (value) vector of each head:
    ``kv.quant.pool_bytes_per_token`` (which the planner uses) passes them here.
    """
    m = get_model(model)
    return int(2 * m.num_layers * m.num_kv_heads * (m.head_dim * dtype_bytes(dtype) + scale_bytes_per_vector))


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Paged blocks of ``block_size`` slots that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``
    (the last block may be partly empty). The one place this rounding is written; the block manager, the KV
    cache, the planner and the evals call it. Raises ``ValueError`` unless ``num_tokens >= 0`` and
    ``block_size >= 1`` are integers."""
    if type(num_tokens) is not int or type(block_size) is not int or num_tokens < 0 or block_size < 1:
        num_tokens = check_token_count("num_tokens", num_tokens)  # numpy / torch integers, or a bad value
        block_size = check_token_count("block_size", block_size, allow_zero=False)
    return -(-num_tokens // block_size)


blocks_needed = blocks_for_tokens  # the name lesson 04 uses


def blocks_that_fit(budget_bytes: float, block_size: int, bytes_per_token: int) -> int:
    """Whole blocks of ``block_size`` tokens of ``bytes_per_token`` bytes each in ``budget_bytes``:
    ``floor(budget / (block_size * bytes_per_token))``, 0 when not one block fits (a negative budget too).

    The one place a KV pool is sized; ``plan.pool_blocks`` (a pool of so many GiB) and
    ``sim.run.kv_pool_blocks`` (what a GPU leaves after the weights) call it and say why a 0 is an error."""
    return max(0, int(budget_bytes // (block_size * bytes_per_token)))


def evicted_tokens(num_tokens: int, compression_ratio: float) -> int:
    """KV entries a press with ``compression_ratio`` evicts of a ``num_tokens`` prompt (per KV head):
    ``floor(ratio * T)``. The one place this count is written: ``kv.press.Press.num_kept`` keeps the rest
    (at least its protected tokens) and the simulator's ``CostModelExecutor`` frees it."""
    return math.floor(compression_ratio * num_tokens)


def padded_tokens(tokens: int, block_size: int | None) -> int:
    """Token slots actually reserved: ``tokens`` rounded up to a whole number of blocks."""
    tokens = check_token_count("tokens", tokens)
    if block_size is None:
        return tokens
    return blocks_for_tokens(tokens, block_size) * block_size


def sliding_blocks_bound(window: int, block_size: int, chunk_tokens: int = 1) -> int:
    """Most blocks a sliding-window layer holds for one request while ``chunk_tokens`` new tokens are
    computed: the blocks that cover the ``window - 1`` keys before the chunk and the chunk,
    ``ceil((window - 1 + chunk) / block_size) + 1`` (one more where they straddle a block edge; vLLM's
    ``SlidingWindowSpec.max_memory_usage_bytes`` counts the same). The one place this bound is written."""
    return blocks_for_tokens(window - 1 + chunk_tokens, block_size) + 1


def layer_tokens_per_request(model: ModelSpec | str, tokens: int, block_size: int | None = None) -> int:
    """Token slots one request of ``tokens`` tokens holds summed over the layers, while it decodes:
    ``L * T`` for full attention; a sliding layer holds at most its window (paged: its
    ``sliding_blocks_bound`` blocks). Rounded to whole blocks if ``block_size``."""
    m = get_model(model)
    held = padded_tokens(tokens, block_size)
    if not m.is_hybrid:
        return m.num_layers * held
    window = m.sliding_window
    cap = window if block_size is None else sliding_blocks_bound(window, block_size) * block_size
    sliding = m.num_sliding_layers
    return (m.num_layers - sliding) * held + sliding * min(held, cap)


def kv_bytes_per_request(
    model: ModelSpec | str, tokens: int, dtype: str = "fp16", block_size: int | None = None
) -> int:
    """KV bytes of one request of ``tokens`` tokens (rounded up to whole blocks if ``block_size``; a hybrid
    model's sliding layers hold their window only: ``layer_tokens_per_request``)."""
    m = get_model(model)
    return layer_tokens_per_request(m, tokens, block_size) * kv_bytes_per_token(m, dtype) // m.num_layers


@dataclass(frozen=True)
class KVPool:
    """KV memory of ``num_requests`` requests that share a prefix.

    ``shared_bytes`` is stored once; ``per_request_bytes`` is stored by every request.
    """

    shared_bytes: int
    per_request_bytes: int
    num_requests: int

    @property
    def total_bytes(self) -> int:
        return self.shared_bytes + self.num_requests * self.per_request_bytes


def split_prefix(tokens: int, shared_prefix_tokens: int, block_size: int | None) -> tuple[int, int]:
    """(token slots stored once, token slots stored per request) of requests of ``tokens`` tokens whose first
    ``shared_prefix_tokens`` are common: paged, only the prefix's full blocks are shared and each request
    stores the rest in whole blocks; unpaged (``block_size=None``), the whole prefix is shared. ``kv_pool``
    and ``plan.plan`` both split a pool this way."""
    tokens = check_token_count("tokens_per_request", tokens)
    prefix = check_token_count("shared_prefix_tokens", shared_prefix_tokens)
    if prefix > tokens:
        raise ValueError(
            f"shared_prefix_tokens ({prefix}) must be <= tokens_per_request ({tokens}): "
            "the prefix is part of each request's context"
        )
    block_size = _block_size(block_size)
    if block_size is None:
        return prefix, tokens - prefix
    shared = (prefix // block_size) * block_size  # only full blocks can be shared
    return shared, padded_tokens(tokens - shared, block_size)


def kv_pool(
    model: ModelSpec | str, num_requests: int, tokens_per_request: int, dtype: str = "fp16",
    shared_prefix_tokens: int = 0, block_size: int | None = None,
) -> KVPool:
    """KV memory of a pool of equal-length requests, with an optional prefix stored once."""
    num_requests = check_token_count("num_requests", num_requests)
    m = get_model(model)
    if m.is_hybrid:
        if shared_prefix_tokens:
            raise ValueError(f"{m.name} has sliding-window layers: prefix sharing is not modelled for it; "
                             "give shared_prefix_tokens=0")
        return KVPool(0, kv_bytes_per_request(m, tokens_per_request, dtype, block_size), num_requests)
    bpt = kv_bytes_per_token(m, dtype)
    shared, unique = split_prefix(tokens_per_request, shared_prefix_tokens, block_size)
    if num_requests == 0:
        shared = 0
    return KVPool(shared * bpt, unique * bpt, num_requests)


def kv_pool_bytes(
    model: ModelSpec | str, num_requests: int, tokens_per_request: int, dtype: str = "fp16",
    shared_prefix_tokens: int = 0, block_size: int | None = None,
) -> int:
    """Total bytes of :func:`kv_pool`. Capstone: 64 x 8K Llama-3-8B fp8 with a 2K prefix = 24.125 GiB."""
    return kv_pool(
        model, num_requests, tokens_per_request, dtype, shared_prefix_tokens, block_size
    ).total_bytes


def max_concurrent_requests(
    model: ModelSpec | str, budget_bytes: float, tokens_per_request: int, dtype: str = "fp16",
    shared_prefix_tokens: int = 0, block_size: int | None = None,
) -> int:
    """Most requests of ``tokens_per_request`` tokens whose KV fits in ``budget_bytes``.

    ``floor((budget - shared) / per_request)``; 0 if even one does not fit. Raises ValueError when each
    request adds no bytes (the prefix is the whole context), since the answer would be unbounded.
    """
    budget = _budget(budget_bytes)
    tokens_per_request = check_token_count("tokens_per_request", tokens_per_request, allow_zero=False)
    pool = kv_pool(model, 1, tokens_per_request, dtype, shared_prefix_tokens, block_size)
    if pool.per_request_bytes == 0:
        raise ValueError(
            "each request adds no KV bytes (shared_prefix_tokens == tokens_per_request), so any number "
            "fits; use a prefix shorter than the context"
        )
    if pool.shared_bytes > budget:
        return 0
    return int((budget - pool.shared_bytes) // pool.per_request_bytes)


def max_context_tokens(
    model: ModelSpec | str, budget_bytes: float, dtype: str = "fp16", num_requests: int = 1,
    block_size: int | None = None,
) -> int:
    """Longest context per request such that ``num_requests`` requests fit ``budget_bytes``.

    ``floor(budget / (num_requests * kv_bytes_per_token))``, rounded down to whole blocks if paged.
    """
    budget = _budget(budget_bytes)
    num_requests = check_token_count("num_requests", num_requests, allow_zero=False)
    block_size = _block_size(block_size)
    tokens = int(budget // (num_requests * kv_bytes_per_token(model, dtype)))
    if block_size is not None:
        tokens = (tokens // block_size) * block_size
    return tokens


def to_gib(num_bytes: float) -> float:
    """Bytes to GiB (2**30 bytes)."""
    return num_bytes / GiB


def to_gb(num_bytes: float) -> float:
    """Bytes to GB (1e9 bytes)."""
    return num_bytes / GB
