"""Attention weights read from the real model, and their entropy: does attention "diffuse" as T grows?

A query at position ``p`` spreads one unit of attention over the ``T = p + 1`` keys it can see. The
entropy ``H = -sum_j w_j ln w_j`` (nats) is ``ln T`` for uniform weights and 0 for one-hot. For random
Gaussian logits with standard deviation ``sigma`` it is about ``ln T - sigma^2 / 2`` (large T): it grows
like ``ln T`` whatever sigma is, which is the source's "nearly uniform" intuition. Real heads differ: many
put most of their weight on the first token (an attention sink, Xiao et al. 2023, arXiv 2309.17453) or
on a few relevant tokens, so their entropy stays far below ``ln T``.

``measure_attention(model, token_ids, layers, query_positions)`` installs ``AttentionProbe``s on the
chosen layers (the model's ``Attention.probe`` hook, off otherwise), runs ONE prefill of
``token_ids[:max(query_positions) + 1]`` and returns per layer, query and head: entropy, max weight and
the weight on token 0. Queries at ``T - 1`` for several ``T`` give entropy against context length.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

from longctx.memory import blocks_for_tokens


def entropy_nats(weights) -> np.ndarray:
    """``-sum w ln w`` over the last axis (0 ln 0 = 0), in nats."""
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)
    return -terms.sum(axis=-1)


def random_logits_entropy(T: int, sigma: float = 1.0, num_samples: int = 64, seed: int = 0) -> float:
    """Mean entropy (nats) of softmax over ``T`` i.i.d. Normal(0, sigma^2) logits."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, sigma, size=(num_samples, int(T)))
    z -= z.max(axis=-1, keepdims=True)
    w = np.exp(z)
    w /= w.sum(axis=-1, keepdims=True)
    return float(entropy_nats(w).mean())


class AttentionProbe:
    """Callable set as ``model.layers[l].attn.probe``: records softmax weights of chosen query positions.

    Weights are recomputed from the post-RoPE q and k the layer sees (scale ``1/sqrt(d_head)``, causal),
    so a RoPE extension's attention factor is included. Keeps ``records[position] = weights [H, T]``."""

    def __init__(self, query_positions) -> None:
        self.query_positions = sorted({int(p) for p in query_positions})
        if not self.query_positions or self.query_positions[0] < 0:
            raise ValueError(f"query_positions must be non-negative token positions, got {query_positions!r}")
        self.records: dict[int, np.ndarray] = {}

    def __call__(self, q, keys, row: int = 0) -> None:
        from longctx.model.attention import attention_weights

        n, H, d = q.shape  # this prefill chunk's queries [n, H, d]
        kv_len = keys.shape[2]  # keys [1, H_kv, kv_len, d]
        first = kv_len - n  # position of q[0]
        for p in self.query_positions:
            if not first <= p < kv_len:
                continue
            qi = q[p - first][:, None, :]  # [H, 1, d]: the query at position p, the last of keys[: p + 1]
            self.records[p] = attention_weights(qi, keys[0, :, : p + 1])[:, 0].cpu().numpy()  # [H, T = p + 1]


@contextmanager
def probes(model, layers, query_positions):
    """Install one ``AttentionProbe`` per layer; always removes them (the hook returns to None)."""
    installed = {}
    try:
        for layer in layers:
            if not 0 <= int(layer) < len(model.layers):
                raise ValueError(f"layer {layer} does not exist: the model has {len(model.layers)} layers")
            installed[int(layer)] = model.layers[int(layer)].attn.probe = AttentionProbe(query_positions)
        yield installed
    finally:
        for layer in installed:
            model.layers[layer].attn.probe = None


def measure_attention(model, token_ids: list[int], layers, query_positions) -> list[dict]:
    """Tidy rows ``{layer, head, T, entropy, uniform_entropy, max_weight, sink_weight}``, one per
    (layer, query position, head); ``T = position + 1`` keys. One prefill of the needed prefix."""
    import torch

    from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata

    positions = sorted({int(p) for p in query_positions})
    if not positions or positions[-1] >= len(token_ids):
        raise ValueError(f"query positions must lie in [0, {len(token_ids)}), got {query_positions!r}")
    ids = token_ids[: positions[-1] + 1]
    p = next(model.parameters())
    block_size = 16
    nb = blocks_for_tokens(len(ids), block_size)
    cache = PagedKVCache.for_model(model.config, nb, block_size, p.device, p.dtype)
    meta = build_attention_metadata([ChunkSlots(list(range(nb)), 0, len(ids))], block_size, p.device)
    with probes(model, layers, positions) as installed, torch.inference_mode():
        model(torch.tensor(ids, device=p.device), cache, meta, logits_rows=torch.tensor([len(ids) - 1]))
    rows = []
    for layer, probe in installed.items():
        for pos, w in probe.records.items():
            ent = entropy_nats(w)
            for h in range(w.shape[0]):
                rows.append({
                    "layer": layer, "head": h, "T": pos + 1, "entropy": float(ent[h]),
                    "uniform_entropy": math.log(pos + 1), "max_weight": float(w[h].max()),
                    "sink_weight": float(w[h, 0]),
                })  # fmt: skip
    return rows
