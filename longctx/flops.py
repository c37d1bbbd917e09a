"""FLOPs of prefill, prefill chunks and decode, and the bytes a step moves (for the roofline).

Linear FLOPs (every weight matrix is used once per token, a multiply and an add per weight)::

    linear_flops = 2 * T * N

``params="all"`` uses all parameters (the source's convention, Kaplan et al. 2020 use 2N too);
``params="matmul"`` leaves out the input embedding table of an untied model (a lookup, not a
matmul). Both count the LM head for every token, as a prefill that returns all logits does.

Attention FLOPs per layer, with ``d_attn = H_q * d_head`` (= d_model here): for every (query, key)
pair, ``q . k`` costs 2*d_attn and adding ``p * v`` costs 2*d_attn, so 4*d_attn per pair:

    full   (every query sees all T keys):          4 * d_attn * T**2
    causal (query i sees keys 0..i):               4 * d_attn * T*(T+1)/2   = (full + 4*d_attn*T) / 2

A chunk of C queries after S cached tokens sees ``C*S + C*(C+1)/2`` pairs (causal) or ``C*(S+C)``
(full). A decode step is the chunk C = 1: the new token attends to S cached keys and itself. The
attention convention is always an explicit argument; FlashAttention reports causal FLOPs as half of
full (Dao 2023), which is what a causal kernel can skip. Softmax (~5 FLOPs per pair) is ignored.

The source material (seed 003, §3.2) uses ``4 * L * T**2 * d_model`` with no causal halving and
N = 7e9 while naming Llama-3-8B: :func:`source_seed_attention_flops` reproduces it for the lessons'
"check the claim" exercises (DESIGN §6 errata 1 and 2).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from longctx.memory import check_token_count, kv_bytes_per_token
from longctx.specs import ModelSpec, dtype_bytes, get_model

ATTENTION_KINDS = ("causal", "full")
PARAM_CONVENTIONS = ("all", "matmul")


def _attention(attention: str) -> str:
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {attention!r}")
    return attention


def linear_params(model: ModelSpec | str, params: str = "all") -> int:
    """Parameters counted in the linear FLOPs: all (``"all"``) or those used in a matmul (``"matmul"``)."""
    m = get_model(model)
    if params == "all":
        return m.num_params
    if params != "matmul":
        raise ValueError(f"params must be one of {', '.join(PARAM_CONVENTIONS)}; got {params!r}")
    if m.embedding_params is None:
        raise ValueError(f"{m.name}: vocab_size unknown, cannot remove the embedding table; use params='all'")
    return m.num_params if m.tie_embeddings else m.num_params - m.embedding_params


def linear_flops(model: ModelSpec | str, tokens: int, params: str = "all") -> int:
    """``2 * T * N``: FLOPs of the weight matmuls for ``tokens`` tokens."""
    return 2 * check_token_count("tokens", tokens) * linear_params(model, params)


def attention_pairs(chunk_tokens: int, cached_tokens: int = 0, attention: str = "causal") -> int:
    """(query, key) pairs scored by ``chunk_tokens`` queries after ``cached_tokens`` cached tokens."""
    c = check_token_count("chunk_tokens", chunk_tokens)
    s = check_token_count("cached_tokens", cached_tokens)
    if _attention(attention) == "full":
        return c * (s + c)
    return c * s + c * (c + 1) // 2  # query i (0-based) sees S + i + 1 keys


def attention_flops(
    model: ModelSpec | str, tokens: int, attention: str = "causal", cached_tokens: int = 0
) -> int:
    """``4 * L * d_attn * pairs``: QK^T and AV FLOPs of ``tokens`` new queries over all layers."""
    m = get_model(model)
    return 4 * m.num_layers * m.d_attn * attention_pairs(tokens, cached_tokens, attention)


@dataclass(frozen=True)
class FlopCount:
    """Linear and attention FLOPs of one piece of work."""

    linear_flops: int
    attention_flops: int

    @property
    def total_flops(self) -> int:
        return self.linear_flops + self.attention_flops

    @property
    def attention_share(self) -> float:
        """Attention / (attention + linear); 0.0 for no work."""
        return self.attention_flops / self.total_flops if self.total_flops else 0.0


def chunk_flops(
    model: ModelSpec | str,
    chunk_tokens: int,
    cached_tokens: int = 0,
    attention: str = "causal",
    params: str = "all",
) -> FlopCount:
    """FLOPs of a prefill chunk of ``chunk_tokens`` tokens after ``cached_tokens`` cached tokens."""
    return FlopCount(
        linear_flops(model, chunk_tokens, params),
        attention_flops(model, chunk_tokens, attention, cached_tokens),
    )


def prefill_flops(
    model: ModelSpec | str, tokens: int, attention: str = "causal", params: str = "all"
) -> FlopCount:
    """FLOPs of a monolithic prefill of ``tokens`` tokens (a chunk with nothing cached)."""
    return chunk_flops(model, tokens, 0, attention, params)


def decode_flops(model: ModelSpec | str, cached_tokens: int, params: str = "all") -> FlopCount:
    """FLOPs of one decode step: one query over ``cached_tokens`` cached keys plus its own."""
    return chunk_flops(model, 1, cached_tokens, "causal", params)


def attention_share(
    model: ModelSpec | str, tokens: int, attention: str = "causal", params: str = "all"
) -> float:
    """Attention share of a prefill's FLOPs."""
    return prefill_flops(model, tokens, attention, params).attention_share


def crossover_tokens(model: ModelSpec | str, attention: str = "causal", params: str = "all") -> float:
    """Prefill length T at which attention FLOPs equal linear FLOPs (solved exactly).

    full:   2*T*N = 4*L*d*T**2         ->  T = N / (2*L*d)
    causal: 2*T*N = 2*L*d*T*(T+1)      ->  T = N / (L*d) - 1
    Teaching 7B (N = 7e9, L = 32, d = 4096): 26,703 (full) and 53,405 (causal).
    """
    m = get_model(model)
    n = linear_params(m, params)
    if _attention(attention) == "full":
        return n / (2 * m.num_layers * m.d_attn)
    return n / (m.num_layers * m.d_attn) - 1


# --- the source's formulas, reproduced exactly for "check the claim" exercises -------------------------


def source_seed_linear_flops(tokens: int, num_params: float = 7e9) -> float:
    """Seed 003's ``2 * T * N`` with its N = 7e9 (although it names Llama-3-8B, N ~ 8.03e9)."""
    return 2.0 * check_token_count("tokens", tokens) * num_params


def source_seed_attention_flops(tokens: int, num_layers: int = 32, d_model: int = 4096) -> float:
    """Seed 003's ``4 * L * T**2 * d_model``: full attention, never halved for the causal mask.

    4K: 8.80e12; 32K: 5.629e14 (the seed prints 563.2 TFLOPs); 128K: 9.007e15; 1M: 5.7646e17.
    """
    t = check_token_count("tokens", tokens)
    return 4.0 * num_layers * float(t) ** 2 * d_model


def source_seed_attention_share(tokens: int, num_params: float = 7e9) -> float:
    """The seed's attention percentage: 13.3 % at 4K, 83.1 % at 128K, 97.5 % at 1M."""
    att = source_seed_attention_flops(tokens)
    return att / (att + source_seed_linear_flops(tokens, num_params))


# --- bytes moved by one step ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """FLOPs and HBM bytes of one engine step (a batch of chunks and decodes).

    Bytes: every weight read once (``N * weight dtype bytes``), every cached K/V read once, the new
    tokens' K/V written once. Activations and the LM head's logits are ignored (small next to these at
    long context).
    """

    linear_flops: int
    attention_flops: int
    weight_bytes: int
    kv_read_bytes: int
    kv_write_bytes: int

    @property
    def flops(self) -> int:
        return self.linear_flops + self.attention_flops

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_read_bytes + self.kv_write_bytes


def step_cost(
    model: ModelSpec | str,
    sequences: Iterable[tuple[int, int]],
    attention: str = "causal",
    params: str = "all",
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
) -> StepCost:
    """Cost of one step over ``sequences``: pairs ``(new_tokens, cached_tokens)`` (decode: ``(1, S)``).

    Example: 16 decodes at 8K context plus a 1,000-token chunk after 3,000 cached tokens is
    ``[(1, 8192)] * 16 + [(1000, 3000)]``.
    """
    m = get_model(model)
    bpt = kv_bytes_per_token(m, kv_dtype)
    lin = att = kv_read = kv_write = 0
    for new_tokens, cached_tokens in sequences:
        f = chunk_flops(m, new_tokens, cached_tokens, attention, params)
        lin += f.linear_flops
        att += f.attention_flops
        kv_read += int(cached_tokens) * bpt
        kv_write += int(new_tokens) * bpt
    weight_bytes = int(m.num_params * dtype_bytes(weight_dtype))
    return StepCost(lin, att, weight_bytes, kv_read, kv_write)
