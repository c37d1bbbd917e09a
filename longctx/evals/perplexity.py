"""Per-position negative log-likelihood of a long text, prefilled in chunks through the paged KV cache.

Chunked prefill is exact (up to rounding), so chunks only bound memory: the logits of one chunk
(``chunk_size x vocab`` floats) exist at a time, never those of the whole text. Perplexity over a span of
positions is ``exp(mean NLL)`` there; ``perplexity_by_bucket`` shows where (in positions) a model breaks,
e.g. past its training length with and without a RoPE extension.
"""

from __future__ import annotations

import math

from longctx.checks import positive_int
from longctx.memory import blocks_for_tokens


def token_nll(model, token_ids: list[int], chunk_size: int = 1024, block_size: int = 16,
              kv_dtype: str | None = None) -> list[float]:
    """``nll[i] = -log p(token_ids[i+1] | token_ids[:i+1])`` in nats, ``len(token_ids) - 1`` values.

    ``kv_dtype`` stores the cache in another format (``longctx.kv.quant``): each chunk after the first reads
    the earlier chunks' keys back quantized, as a serving engine's chunked prefill does."""
    import torch

    from longctx.evals.forcing import forward_at
    from longctx.kv.cache import PagedKVCache

    n = len(token_ids)
    if n < 2:
        raise ValueError(f"need at least 2 tokens, got {n}")
    positive_int("chunk_size", chunk_size)
    p = next(model.parameters())
    num_blocks = blocks_for_tokens(n, block_size)
    cache = PagedKVCache.for_model(model.config, num_blocks, block_size, p.device, p.dtype, kv_dtype)
    table = list(range(num_blocks))
    targets = torch.tensor(token_ids[1:] + [0], device=p.device)
    nll: list[float] = []
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        logits = forward_at(model, cache, table, token_ids[start:stop], start, list(range(stop - start)),
                            block_size=block_size)
        lp = torch.log_softmax(logits, dim=-1)  # [chunk, vocab]
        nll += (-lp.gather(1, targets[start:stop, None])[:, 0]).tolist()
    return nll[: n - 1]


def perplexity_by_bucket(nll: list[float], bucket_tokens: int = 1024) -> list[tuple[int, int, float]]:
    """``[(start, stop, perplexity)]`` over consecutive buckets of predicted positions."""
    if bucket_tokens < 1:
        raise ValueError(f"bucket_tokens must be >= 1, got {bucket_tokens}")
    out = []
    for start in range(0, len(nll), bucket_tokens):
        part = nll[start : start + bucket_tokens]
        out.append((start + 1, start + 1 + len(part), math.exp(sum(part) / len(part))))
    return out
