"""A Gemma 3 decoder (text only), top-down in one file, over the same paged KV cache and attention backends
as ``longctx.model.llama``.

    h = embed(tokens) * sqrt(d_model)
    for each layer:  h = h + PostNorm(Attention(Norm(h)));  h = h + PostNorm(MLP(Norm(h)))
    logits = Norm(h) @ W_embed^T                                 (tied embeddings)

What differs from Llama, each checked against transformers 5.24's ``models/gemma3/modeling_gemma3.py``
(``Gemma3ForCausalLM``) loading the same GGUF (tests/test_gemma3.py):

- the embedding is multiplied by ``sqrt(d_model)`` (rounded to the weights' dtype, as transformers does);
- four RMSNorms a layer: before and *after* attention, before and after the MLP; each multiplies in float32
  *before* casting back (Llama casts first), by a weight stored as ``1 + w`` in the GGUF (transformers
  stores ``w`` and adds the 1; we keep the file's number);
- QK-norm: an RMSNorm over each query and each key head (``head_dim`` wide) before RoPE;
- the MLP is GeGLU with tanh-approximated GELU: ``down(gelu_tanh(gate(x)) * up(x))``;
- attention scale ``1 / sqrt(query_pre_attn_scalar)`` (256 = head_dim for the 270M model);
- two kinds of layer: *sliding* layers attend to the last ``sliding_window`` tokens (key ``k`` is seen by
  query ``q`` when ``q - window < k <= q``) with RoPE base 10,000; every 6th layer (5, 11, 17) is *global*
  (all earlier tokens) with base 1,000,000 (``ModelSpec.is_sliding_layer``);
- no logit soft-capping in Gemma 3 (Gemma 2 had it); 4 query heads share 1 KV head (MQA).

A sliding layer reads its keys from its own KV-cache group (``longctx.kv.hybrid``): the pool keeps only the
blocks that cover its window, so the step's metadata differs per group (``meta.for_layer``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from longctx.model.attention import REFERENCE, AttentionBackend, choose_backend
from longctx.model.config import check_runnable
from longctx.model.llama import MLP, Attention, RMSNorm, apply_rope, init_random_, rope_cos_sin
from longctx.specs import ModelSpec


def gemma_norm(dim: int, eps: float, device=None, dtype=None) -> RMSNorm:
    """Gemma's RMSNorm: the weight (``1 + w``, as the GGUF stores it) multiplies in float32, then the cast."""
    return RMSNorm(dim, eps, device, dtype, weight_in_float32=True)


class GemmaAttention(Attention):
    """Llama's projections plus QK-norm, a sliding window on most layers and the query scale
    (``probe`` stays unused: presses and attention readers are refused on Gemma for now)."""

    def __init__(self, config: ModelSpec, layer: int, device=None, dtype=None):
        super().__init__(config, device, dtype)
        c = config
        self.sliding = c.is_sliding_layer(layer)
        self.q_norm = gemma_norm(c.head_dim, c.rms_norm_eps, device, dtype)
        self.k_norm = gemma_norm(c.head_dim, c.rms_norm_eps, device, dtype)
        # the backends scale by 1/sqrt(head_dim); a different query_pre_attn_scalar rescales the queries
        scalar = c.query_pre_attn_scalar or c.head_dim
        self.q_rescale = math.sqrt(c.head_dim / scalar)

    def forward(self, x, cos, sin, kv, meta, backend: AttentionBackend = REFERENCE):
        T = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(T, self.num_heads, self.head_dim))  # [T, H, d]
        k = self.k_norm(self.k_proj(x).view(T, self.num_kv_heads, self.head_dim))  # [T, H_kv, d]
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, H_kv, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_rescale != 1.0:
            q = q * self.q_rescale
        k_cache, v_cache = kv
        k_cache[meta.slot_mapping] = k
        v_cache[meta.slot_mapping] = v
        out = torch.empty_like(q)  # [T, H, d]
        backend.attend(q, k, v, k_cache, v_cache, meta, out, None)
        return self.o_proj(out.view(T, self.num_heads * self.head_dim))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation (transformers' ``gelu_pytorch_tanh``)."""
    return F.gelu(x, approximate="tanh")


class GemmaBlock(nn.Module):
    def __init__(self, config: ModelSpec, layer: int, device=None, dtype=None):
        super().__init__()
        eps, d = config.rms_norm_eps, config.d_model
        self.attn_norm = gemma_norm(d, eps, device, dtype)
        self.attn = GemmaAttention(config, layer, device, dtype)
        self.post_attn_norm = gemma_norm(d, eps, device, dtype)
        self.mlp_norm = gemma_norm(d, eps, device, dtype)
        self.mlp = MLP(config, device, dtype, act=gelu_tanh)  # GeGLU
        self.post_mlp_norm = gemma_norm(d, eps, device, dtype)

    def forward(self, h, cos, sin, kv, meta, backend: AttentionBackend = REFERENCE):
        h = h + self.post_attn_norm(self.attn(self.attn_norm(h), cos, sin, kv, meta, backend))
        return h + self.post_mlp_norm(self.mlp(self.mlp_norm(h)))


class Gemma3(nn.Module):
    """Gemma 3 of any shape. ``forward`` runs one engine step over the paged cache, as ``Llama.forward``."""

    def __init__(self, config: ModelSpec, device=None, dtype=None, attention_backend: str = "auto"):
        super().__init__()
        if config.architecture != "gemma3" or not config.tie_embeddings:
            raise ValueError(f"Gemma3 builds a gemma3 model with tied embeddings; got {config.name!r} "
                             f"({config.architecture})")
        self.config = check_runnable(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(GemmaBlock(config, i, device, dtype) for i in range(config.num_layers))
        self.norm = gemma_norm(config.d_model, config.rms_norm_eps, device, dtype)
        self.attention_backend = choose_backend(attention_backend, self.embed.weight.device,
                                                self.embed.weight.dtype, sliding_window=config.is_hybrid)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.embed.weight

    @property
    def rope_scaling(self) -> None:
        """Plain RoPE (two bases); RoPE extensions are implemented for ``Llama`` only."""
        return None

    @rope_scaling.setter
    def rope_scaling(self, scaling: dict | None) -> None:
        if scaling:
            raise ValueError(f"RoPE scaling is not implemented for {self.config.name} (gemma3): "
                             "run it with plain RoPE")

    def forward(self, input_ids, cache, meta, logits_rows=None, backend: AttentionBackend | None = None):
        """input_ids: [T]; ``meta`` answers ``for_layer(i)`` (a hybrid pool's step metadata, one per
        KV-cache group, or one ``AttentionMetadata`` for all layers). Returns logits ``[R, vocab]``."""
        backend = backend or self.attention_backend.backend
        c = self.config
        scale = torch.tensor(math.sqrt(c.d_model), dtype=self.embed.weight.dtype)
        h = self.embed(input_ids) * scale  # [T, d_model]
        positions = meta.for_layer(0).positions
        rope = {
            False: rope_cos_sin(positions, c.head_dim, c.rope_theta, h.dtype),
            True: rope_cos_sin(positions, c.head_dim, c.rope_local_theta or c.rope_theta, h.dtype),
        }
        for i, block in enumerate(self.layers):
            cos, sin = rope[block.attn.sliding]
            h = block(h, cos, sin, cache.flat(i), meta.for_layer(i), backend)
        if logits_rows is not None:
            h = h[logits_rows]  # [R, d_model]
        return F.linear(self.norm(h), self.output_weight)  # [R, vocab]

    def init_random_(self, seed: int = 0, std: float = 0.02) -> Gemma3:
        """Random weights (normal(0, std), norms at 1) for speed/memory experiments at any shape."""
        return init_random_(self, seed, std)
