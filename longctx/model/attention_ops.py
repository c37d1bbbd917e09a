"""Attention's building blocks, shared by the backends (``longctx.model.attention``,
``longctx.model.paged_flex``), the KV presses and the attention readers: GQA SDPA, the causal mask, causal
softmax weights, a chunk's keys.

Shapes: a step's queries ``q`` [T, H, d]; fresh keys/values [T, H_kv, d]; a layer's flat pool
[num_slots, H_kv, d]; ``meta`` is the step's ``longctx.kv.cache.AttentionMetadata``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def sdpa(q, k, v, mask=None, is_causal=False):
    """Scaled dot-product attention with GQA: q [B, H, n, d], k/v [B, H_kv, L, d] -> [B, H, n, d].

    Each group of ``H / H_kv`` query heads reads the same K/V head (``enable_gqa``: no copies). ``mask`` is a
    boolean (True = attend) or additive tensor broadcastable to [B, H, n, L], or a ``torch.nn.attention.bias``
    object such as ``causal_lower_right``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)


def causal_mask(kv_len: int, first: int, stop: int, device=None, window: int | None = None) -> torch.Tensor:
    """``[stop - first, kv_len]`` booleans: query at position ``p`` (rows ``first … stop - 1``) sees
    keys ``<= p`` (and ``> p - window`` with a sliding ``window``)."""
    q_pos = torch.arange(first, stop, device=device)[:, None]
    k_pos = torch.arange(kv_len, device=device)[None, :]
    seen = k_pos <= q_pos
    return seen if window is None else seen & (k_pos > q_pos - window)


def attention_weights(queries: torch.Tensor, keys: torch.Tensor, tile_rows: int = 256) -> torch.Tensor:
    """Causal softmax weights of the last ``n`` queries over all ``T`` keys: ``[H, n, T]`` (float32, scale
    ``1/sqrt(d)``): what KV presses score with and what attention readers record.

    queries ``[H, n, d]`` are positions ``T - n … T - 1``; keys ``[H_kv, T, d]``; query head ``h`` reads
    KV head ``h // (H / H_kv)``."""
    H, n, d = queries.shape
    H_kv, T, _ = keys.shape
    k = keys.float().repeat_interleave(H // H_kv, dim=0)  # [H, T, d]
    out = torch.empty(H, n, T, device=keys.device)
    for r0 in range(0, n, tile_rows):  # query tiles bound the [H, rows, T] scores on long prompts
        r1 = min(n, r0 + tile_rows)
        scores = queries[:, r0:r1].float() @ k.transpose(1, 2) / math.sqrt(d)  # [H, rows, T]
        scores.masked_fill_(~causal_mask(T, T - n + r0, T - n + r1, keys.device), float("-inf"))
        out[:, r0:r1] = scores.softmax(dim=-1)
    return out


def prefill_keys(k, v, k_cache, v_cache, meta, i):
    """Keys and values of prefill chunk ``i`` as ``[1, H_kv, kv_len, d]``: the fresh ones when nothing is
    cached yet, else read back from the pool through its block table (a view when
    its blocks are consecutive)."""
    start, n, kv_len = meta.q_starts[i], meta.q_lens[i], meta.kv_lens[i]
    if kv_len == n:
        keys, values = k[start : start + n], v[start : start + n]
    else:
        index = meta.kv_index[i]  # a slice (consecutive blocks) or a gather
        keys, values = k_cache[index], v_cache[index]  # [kv_len, H_kv, d]
    return keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)


def fresh_prompt(q, keys, values, start, n, out) -> None:
    """A chunk with nothing cached: one causal call (fused kernels skip the masked half, store no scores)."""
    qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
    out[start : start + n] = sdpa(qi, keys, values, is_causal=True).squeeze(0).transpose(0, 1)
