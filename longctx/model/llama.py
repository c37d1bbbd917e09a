"""A Llama decoder, top-down in one file: model -> block -> attention over the paged KV cache / MLP.

    h = embed(tokens)
    for each layer:  h = h + Attention(RMSNorm(h));  h = h + MLP(RMSNorm(h))
    logits = RMSNorm(h) @ W_out^T                    (W_out = the embedding matrix when tied)

Attention is grouped-query (GQA): ``num_heads`` query heads share ``num_kv_heads`` K/V heads. Rotary position
embeddings (RoPE, Su et al. 2021) rotate q and k by angles ``position * theta^(-2i/d_head)`` in the
"rotate-half" layout of Meta's and transformers' Llama. The MLP is SwiGLU: ``down(silu(gate(x)) * up(x))``.

A step's tokens from all sequences are concatenated into one ``[T, d_model]`` matrix: every linear layer
runs once per step, whatever mixes of prefill chunks and decodes the scheduler chose. Only attention
looks at sequences one by one, through the model's attention backend (``longctx.model.attention``: the
readable ``reference`` backend, or the ``fused`` one for CUDA that reads the paged pool in place). The config
is separate from the weights: ``Llama(config, device, dtype)`` builds any Llama shape; ``init_random_``
fills it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longctx.kv.cache import AttentionMetadata, PagedKVCache
from longctx.model.attention import REFERENCE, AttentionBackend, choose_backend
from longctx.model.config import check_runnable
from longctx.model.rope import rope_parameters
from longctx.specs import ModelSpec


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich 2019), normalised in float32; Llama casts
    back before the weight multiplies, Gemma after (``weight_in_float32``)."""

    def __init__(self, dim: int, eps: float, device=None, dtype=None, weight_in_float32: bool = False):
        super().__init__()
        self.eps, self.weight_in_float32 = eps, weight_in_float32
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_in_float32:
            return (x32 * self.weight.float()).to(x.dtype)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    dtype,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles, ``[T, head_dim]`` each (the angle list repeated for both halves).

    ``inv_freq`` [d/2] and ``attention_factor`` come from ``longctx.model.rope.rope_parameters`` when the
    model uses a RoPE extension (PI, NTK, YaRN); by default plain RoPE. cos and sin are multiplied by
    ``attention_factor`` (YaRN's temperature; 1 otherwise), as transformers does."""
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]  # [T, d/2]
    emb = torch.cat([angles, angles], dim=-1)  # [T, d]
    if attention_factor != 1.0:
        return (emb.cos() * attention_factor).to(dtype), (emb.sin() * attention_factor).to(dtype)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, H, d] by position: ``x * cos + rotate_half(x) * sin``, rotate_half(a, b) = (-b, a)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]  # cos: [T, 1, d]


class Attention(nn.Module):
    # Off by default. A callable ``probe(q, keys, row)`` set on one layer's Attention is called for every
    # sequence of a step with its new queries ``q`` [n, H, d] (rows ``row … row + n - 1`` of the step) and
    # all its keys [1, H_kv, kv_len, d] (both after RoPE): to read attention weights (longctx.evals.attention)
    # or collect what a KV press needs (longctx.engine.pruning). A probed layer attends with the reference
    # backend; None costs one test per step.
    probe = None

    def __init__(self, config: ModelSpec, device=None, dtype=None):
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.q_proj = nn.Linear(c.d_model, c.num_heads * c.head_dim, **kw)
        self.k_proj = nn.Linear(c.d_model, c.num_kv_heads * c.head_dim, **kw)
        self.v_proj = nn.Linear(c.d_model, c.num_kv_heads * c.head_dim, **kw)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.d_model, **kw)

    def forward(self, x, cos, sin, kv, meta: AttentionMetadata, backend: AttentionBackend = REFERENCE):
        """x: [T, d_model]; kv: this layer's flat cache ``[num_slots, H_kv, d]`` K and V; ``backend``
        attends."""
        T = x.shape[0]
        q = apply_rope(self.q_proj(x).view(T, self.num_heads, self.head_dim), cos, sin)  # [T, H, d]
        k = apply_rope(self.k_proj(x).view(T, self.num_kv_heads, self.head_dim), cos, sin)  # [T, H_kv, d]
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)  # [T, H_kv, d]
        k_cache, v_cache = kv
        k_cache[meta.slot_mapping] = k  # write the new keys/values at their pool slots
        v_cache[meta.slot_mapping] = v
        out = torch.empty_like(q)  # [T, H, d]
        if self.probe is not None:
            backend = REFERENCE
        backend.attend(q, k, v, k_cache, v_cache, meta, out, self.probe)
        return self.o_proj(out.view(T, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """A gated MLP: ``down(act(gate(x)) * up(x))``; SwiGLU (Shazeer 2020, ``act`` = SiLU) in Llama, GeGLU
    with tanh-approximated GELU in Gemma."""

    def __init__(self, config: ModelSpec, device=None, dtype=None, act=F.silu):
        super().__init__()
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.act = act
        self.gate_proj = nn.Linear(config.d_model, config.intermediate_size, **kw)
        self.up_proj = nn.Linear(config.d_model, config.intermediate_size, **kw)
        self.down_proj = nn.Linear(config.intermediate_size, config.d_model, **kw)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: ModelSpec, device=None, dtype=None):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.rms_norm_eps, device, dtype)
        self.attn = Attention(config, device, dtype)
        self.mlp_norm = RMSNorm(config.d_model, config.rms_norm_eps, device, dtype)
        self.mlp = MLP(config, device, dtype)

    def forward(self, h, cos, sin, kv, meta, backend: AttentionBackend = REFERENCE):
        h = h + self.attn(self.attn_norm(h), cos, sin, kv, meta, backend)
        return h + self.mlp(self.mlp_norm(h))


class Llama(nn.Module):
    """A Llama of any shape. ``forward`` runs one engine step over the paged cache."""

    def __init__(self, config: ModelSpec, device=None, dtype=None, attention_backend: str = "auto"):
        super().__init__()
        self.config = check_runnable(config)
        self.embed = nn.Embedding(config.vocab_size, config.d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(Block(config, device, dtype) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.d_model, config.rms_norm_eps, device, dtype)
        if not config.tie_embeddings:
            self.lm_head = nn.Linear(
                config.d_model, config.vocab_size, bias=False, device=device, dtype=dtype
            )

        # ``longctx.model.attention.choose_backend``: TorchExecutor re-chooses it knowing its KV pool
        self.attention_backend = choose_backend(attention_backend, self.embed.weight.device,
                                                self.embed.weight.dtype)

    @property
    def output_weight(self) -> torch.Tensor:
        """``[vocab, d_model]``: the embedding matrix when tied (SmolLM2), else ``lm_head.weight``."""
        return self.embed.weight if self.config.tie_embeddings else self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: PagedKVCache,
        meta: AttentionMetadata,
        logits_rows: torch.Tensor | None = None,
        backend: AttentionBackend | None = None,
    ) -> torch.Tensor:
        """input_ids: [T] tokens of the step (all sequences concatenated). Writes their K/V into ``cache``.

        Returns logits ``[len(logits_rows), vocab]`` for the chosen rows (default: all ``T`` rows): the
        engine needs only the last row of each sequence, which saves the big output matmul elsewhere.
        ``backend`` attends (``longctx.model.attention``; default: the model's ``attention_backend``; an
        engine passes the one it chose for its pool).
        """
        backend = backend or self.attention_backend.backend
        h = self.embed(input_ids)  # [T, d_model]
        cos, sin = self._rope(meta.positions, h.dtype)
        for layer, block in enumerate(self.layers):
            h = block(h, cos, sin, cache.flat(layer), meta, backend)
        if logits_rows is not None:
            h = h[logits_rows]  # [R, d_model]
        return F.linear(self.norm(h), self.output_weight)  # [R, vocab]

    @property
    def rope_scaling(self) -> dict | None:
        """RoPE extension in transformers' ``rope_scaling`` format (None: plain RoPE); settable."""
        return self.__dict__.get("_rope_scaling", getattr(self.config, "rope_scaling", None))

    @rope_scaling.setter
    def rope_scaling(self, scaling: dict | None) -> None:
        rope_parameters(self.config.head_dim, self.config.rope_theta, scaling)  # validates
        self.__dict__["_rope_scaling"] = None if scaling is None else dict(scaling)

    def _rope(self, positions: torch.Tensor, dtype):
        scaling = self.rope_scaling
        if not scaling:  # plain RoPE: the original path
            return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype)
        seq_len = int(positions.max()) + 1 if positions.numel() else None  # used by "dynamic" only
        inv_freq, factor = rope_parameters(self.config.head_dim, self.config.rope_theta, scaling, seq_len)
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, dtype, inv_freq, factor)

    def init_random_(self, seed: int = 0, std: float = 0.02) -> Llama:
        """Random weights (normal(0, std), norms at 1) for speed/memory experiments at any shape."""
        return init_random_(self, seed, std)


@torch.no_grad()
def init_random_(model: nn.Module, seed: int = 0, std: float = 0.02) -> nn.Module:
    """Fill ``model``'s weights with normal(0, std) draws from a seeded generator, its norms with 1."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=gen)
    return model
