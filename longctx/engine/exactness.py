"""Is chunked prefill exact? Measure it: logits of a prompt prefilled in chunks vs all at once.

In exact arithmetic chunking changes nothing (each query still sees exactly the keys at positions <= its
own). In floating point the sums are grouped differently, so logits differ at rounding level: these
functions measure how much, on the real model and the paged cache (no engine, no scheduler).
"""

from __future__ import annotations

import torch

from longctx.kv.block_manager import blocks_for_tokens
from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata


def chunked_prefill_logits(model, token_ids: list[int], chunk_size: int | None, block_size: int = 16):
    """Logits ``[len(token_ids), vocab]`` (float32, CPU) of every prompt position, prefilling the prompt
    through the paged cache in chunks of ``chunk_size`` tokens (None: one monolithic chunk)."""
    n = len(token_ids)
    if n == 0:
        raise ValueError("token_ids is empty")
    chunk = n if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    p = next(model.parameters())
    cache = PagedKVCache.for_model(
        model.config, blocks_for_tokens(n, block_size), block_size, p.device, p.dtype
    )
    table = list(range(cache.num_blocks))
    out = []
    with torch.inference_mode():
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            meta = build_attention_metadata([ChunkSlots(table, start, stop - start)], block_size, p.device)
            ids = torch.tensor(token_ids[start:stop], device=p.device)
            out.append(model(ids, cache, meta).float().cpu())
    return torch.cat(out)


def chunked_prefill_max_diff(model, token_ids: list[int], chunk_sizes=(1, 7, 64, 512)) -> dict[int, float]:
    """max |logit(chunked) - logit(monolithic)| over all prompt positions, for each chunk size."""
    reference = chunked_prefill_logits(model, token_ids, None)
    return {
        int(c): float((chunked_prefill_logits(model, token_ids, c) - reference).abs().max())
        for c in chunk_sizes
    }
