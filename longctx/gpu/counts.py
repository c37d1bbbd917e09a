"""FLOPs and bytes that one measured step really executes (pure Python: records and cells use it without
torch). Conventions: ``longctx.flops`` (causal attention counted as FlashAttention does, 4 H d_head per
(query, key) pair per layer; a matmul of an m x k by a k x n matrix is 2 m k n FLOPs)."""

from __future__ import annotations

from longctx.specs import ModelSpec, get_model


def layer_params(c: ModelSpec) -> int:
    """Weights of one layer's matmuls (q, k, v, o, gate, up, down)."""
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    return c.d_model * (2 * q + 2 * kv) + 3 * c.d_model * c.intermediate_size


def causal_pairs(new_tokens: int, cached_tokens: int) -> int:
    """(query, key) pairs of a causal chunk after ``cached_tokens``: ``C*S + C*(C+1)/2``."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


def executed_flops(c: ModelSpec, sequences, logits_rows: int) -> dict:
    """FLOPs one forward pass executes over ``(new_tokens, cached_tokens)`` pairs, computing the LM head
    on ``logits_rows`` rows: linear ``2 T N_layers + 2 R V d``; attention ``4 H d_head`` per causal pair
    per layer (QK^T and AV, FlashAttention's convention)."""
    tokens = sum(n for n, _ in sequences)
    pairs = sum(causal_pairs(n, s) for n, s in sequences)
    linear = 2 * tokens * layer_params(c) * c.num_layers + 2 * logits_rows * c.vocab_size * c.d_model
    attention = 4 * c.num_heads * c.head_dim * pairs * c.num_layers
    return {"linear_flops": int(linear), "attention_flops": int(attention), "flops": int(linear + attention)}


def kv_bytes_per_token(c: ModelSpec, dtype_bytes: int) -> int:
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * dtype_bytes


def min_step_bytes(c: ModelSpec, sequences, dtype_bytes: int) -> int:
    """Bytes a step must move at least: every matmul weight and the LM head once, every cached K/V read
    once, the new K/V written once (activations and the embedding rows ignored)."""
    weights = (layer_params(c) * c.num_layers + c.vocab_size * c.d_model) * dtype_bytes
    kv = sum(n + s for n, s in sequences) * kv_bytes_per_token(c, dtype_bytes)
    return int(weights + kv)


def model_spec(name: str, config: ModelSpec) -> ModelSpec:
    """A ``longctx.specs.ModelSpec`` with ``config``'s shapes (for the cost model and the flops module)."""
    return ModelSpec(name, config.num_layers, config.d_model, config.num_heads, config.num_kv_heads,
                     config.head_dim, "random-weight model built by longctx.gpu at this shape",
                     intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                     rope_theta=config.rope_theta, tie_embeddings=config.tie_embeddings)


def registry_spec(name: str, config: ModelSpec) -> ModelSpec:
    """The registry's spec when ``name`` is registered with the same layer count, else ``model_spec``."""
    try:
        spec = get_model(name)
    except ValueError:
        return model_spec(name, config)
    same = (spec.num_layers, spec.d_model, spec.num_heads) == (config.num_layers, config.d_model,
                                                              config.num_heads)
    return spec if same else model_spec(name, config)


def rest_of_layer_bytes(c: ModelSpec, tokens: int, dtype_bytes: int) -> int:
    """Bytes one layer's non-attention part moves at least on ``tokens`` rows: its weights once, and the
    activations each matmul reads and writes (x, q/k/v/o, gate/up/down)."""
    acts = tokens * (4 * c.d_model + 2 * (c.num_heads + c.num_kv_heads) * c.head_dim + 3 * c.intermediate_size)
    return (layer_params(c) + acts) * dtype_bytes


def attention_core_bytes(c: ModelSpec, tokens: int, dtype_bytes: int) -> int:
    """Bytes a fused causal attention over ``tokens`` rows moves at least: q, k, v read, the output written."""
    return tokens * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) * dtype_bytes
