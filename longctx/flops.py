"""FLOPs of prefill, prefill chunks and decode, and the bytes a step moves (for the roofline).

Linear FLOPs: every weight of a matrix multiply takes part in one multiply and one add per token that
goes through it. Which weights, and for which tokens, is a *convention*, always an explicit argument
(``params``), like the attention mask:

``params="matmul"`` (the course's convention, the default)::

    linear_flops = 2 * T * N_layers  +  2 * R * N_head

    N_layers = L * (d*(H_q*d_head) + 2*d*(H_kv*d_head) + (H_q*d_head)*d + 3*d*d_ff)   # q, k, v, o, MLP
    N_head   = vocab * d                                                              # the LM head
    R        = rows whose logits are computed: 1 for a prefill (only its last token is sampled)
               or a decode; 0 for a chunk that does not end its prompt (``logit_tokens``)

  The input embedding is a table lookup, not a matmul, and the RMSNorm weights are elementwise: neither
  is counted. (Llama-3-8B: N_layers = 6.98e9 of its 8.03e9 parameters; its two 525M-parameter tables
  are the input embedding, a lookup, and the LM head, used once per prefill.) A model registered with
  only a round ``num_params`` (the source's teaching 7B) has N_layers = num_params and no LM head term.

``params="all"``: ``2 * T * N`` with N = every parameter, embeddings included, for every token: the
  source material's convention. It is a rough upper bound. (Kaplan et al. 2020 write C_forward ~ 2N with
  N the *non-embedding* parameters, which is close to "matmul" without the LM head.)

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
from longctx.specs import ModelSpec, dtype_bytes, get_model, mlp_matrices

ATTENTION_KINDS = ("causal", "full")
PARAM_CONVENTIONS = ("matmul", "all")


def _attention(attention: str) -> str:
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {attention!r}")
    return attention


def _params(params: str) -> str:
    if params not in PARAM_CONVENTIONS:
        raise ValueError(f"params must be one of {', '.join(PARAM_CONVENTIONS)}; got {params!r}")
    return params


def _has_shapes(m: ModelSpec) -> bool:
    return m.intermediate_size is not None and m.vocab_size is not None


def lm_head_params(model: ModelSpec | str) -> int:
    """Parameters of the LM head (vocab x d_model; the tied table when embeddings are tied); 0 if unknown."""
    m = get_model(model)
    return m.vocab_size * m.d_model if _has_shapes(m) else 0


def linear_params(model: ModelSpec | str, params: str = "matmul") -> int:
    """Parameters multiplied by *every* token: N_layers (``"matmul"``) or all of N (``"all"``).

    ``"matmul"``: the q, k, v, o and MLP matrices of every layer (no embeddings, no norms, no LM head,
    which :func:`linear_flops` counts separately for the rows whose logits are computed).
    """
    m = get_model(model)
    if _params(params) == "all" or not _has_shapes(m):
        return m.num_params
    q_out, kv_out = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    per_layer = (
        m.d_model * q_out
        + 2 * m.d_model * kv_out
        + q_out * m.d_model
        + mlp_matrices(m) * m.d_model * m.intermediate_size
    )
    return m.num_layers * per_layer


def linear_flops(
    model: ModelSpec | str, tokens: int, params: str = "matmul", logit_tokens: int | None = None
) -> int:
    """FLOPs of the weight matmuls for ``tokens`` tokens (module docstring).

    ``"matmul"``: ``2*T*N_layers + 2*R*N_head`` with R = ``logit_tokens`` (default: 1, the last token,
    or 0 when T = 0). ``"all"``: ``2*T*N`` (``logit_tokens`` is then ignored: every token counts all).
    """
    t = check_token_count("tokens", tokens)
    m = get_model(model)
    if _params(params) == "all":
        return 2 * t * m.num_params
    rows = min(t, 1) if logit_tokens is None else check_token_count("logit_tokens", logit_tokens)
    if rows > t:
        raise ValueError(f"logit_tokens ({rows}) must be <= tokens ({t}): logits come from the new tokens")
    return 2 * t * linear_params(m, "matmul") + 2 * rows * lm_head_params(m)


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
    model: ModelSpec | str, chunk_tokens: int, cached_tokens: int = 0, attention: str = "causal",
    params: str = "matmul", logit_tokens: int | None = None,
) -> FlopCount:
    """FLOPs of a prefill chunk of ``chunk_tokens`` tokens after ``cached_tokens`` cached tokens.

    ``logit_tokens``: rows whose logits are computed (default 1: the chunk's last token; pass 0 for a
    chunk that does not end its prompt, so that chunks add up exactly to the monolithic prefill).
    """
    return FlopCount(
        linear_flops(model, chunk_tokens, params, logit_tokens),
        attention_flops(model, chunk_tokens, attention, cached_tokens),
    )


def prefill_flops(
    model: ModelSpec | str, tokens: int, attention: str = "causal", params: str = "matmul"
) -> FlopCount:
    """FLOPs of a monolithic prefill of ``tokens`` tokens (a chunk with nothing cached)."""
    return chunk_flops(model, tokens, 0, attention, params)


def decode_flops(model: ModelSpec | str, cached_tokens: int, params: str = "matmul") -> FlopCount:
    """FLOPs of one decode step: one query over ``cached_tokens`` cached keys plus its own."""
    return chunk_flops(model, 1, cached_tokens, "causal", params)


def attention_share(
    model: ModelSpec | str, tokens: int, attention: str = "causal", params: str = "matmul"
) -> float:
    """Attention share of a prefill's FLOPs."""
    return prefill_flops(model, tokens, attention, params).attention_share


def crossover_tokens(model: ModelSpec | str, attention: str = "causal", params: str = "matmul") -> float:
    """Prefill length T at which attention FLOPs equal linear FLOPs (solved exactly).

    With n = :func:`linear_params` and h = the LM head's FLOPs/2 (``"matmul"``: one row of logits)::

        full:   2*T*n + 2*h = 4*L*d*T**2         ->  T = (n + sqrt(n**2 + 8*L*d*h)) / (4*L*d)
        causal: 2*T*n + 2*h = 2*L*d*T*(T+1)      ->  L*d*T**2 + (L*d - n)*T - h = 0
    Without the head term (h = 0): T = n / (2*L*d) (full) and n / (L*d) - 1 (causal).
    Teaching 7B (N = 7e9, L = 32, d = 4096): 26,703 (full) and 53,405 (causal). Llama-3-8B: 53,249
    (causal, "matmul") against 61,265 with ``params="all"``.
    """
    m = get_model(model)
    n = float(linear_params(m, params))
    h = float(lm_head_params(m)) if params == "matmul" else 0.0
    a = float(m.num_layers * m.d_attn)
    if _attention(attention) == "full":
        return (n + (n * n + 8.0 * a * h) ** 0.5) / (4.0 * a)
    b = a - n
    return (-b + (b * b + 4.0 * a * h) ** 0.5) / (2.0 * a)


def tokens_for_attention_share(
    model: ModelSpec | str, share: float, attention: str = "causal", params: str = "matmul"
) -> float:
    """Prefill length T at which attention is ``share`` (0 < share < 1) of the prefill FLOPs.

    attention = share/(1 - share) * linear: the crossover is ``share = 0.5``. The 7B model (causal):
    65 % at ~99K tokens, 90 % at ~480K.
    """
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < float(share) < 1.0:
        raise ValueError(f"share must be a fraction strictly between 0 and 1, got {share!r}")
    m = get_model(model)
    r = float(share) / (1.0 - float(share))
    n = float(linear_params(m, params))
    h = float(lm_head_params(m)) if params == "matmul" else 0.0
    a = float(m.num_layers * m.d_attn)
    if _attention(attention) == "full":  # 2*a*T**2 = r*(n*T + h)
        return (r * n + ((r * n) ** 2 + 8.0 * a * r * h) ** 0.5) / (4.0 * a)
    b = a - r * n  # a*T**2 + (a - r*n)*T - r*h = 0
    return (-b + (b * b + 4.0 * a * r * h) ** 0.5) / (2.0 * a)


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

    Bytes: every weight read once (``N * weight dtype bytes``; with ``params="matmul"`` an untied input
    embedding table is left out: a step reads only the rows it looks up), every cached K/V read once, the
    new tokens' K/V written once. Activations and the LM head's logits are ignored (small next to these at
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
    model: ModelSpec | str, sequences: Iterable[tuple[int, int]], attention: str = "causal",
    params: str = "matmul", weight_dtype: str = "bf16", kv_dtype: str = "bf16",
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
    read_params = m.num_params
    if _params(params) == "matmul" and _has_shapes(m):  # the input table is looked up, not streamed
        read_params = m.num_params - (0 if m.tie_embeddings else m.vocab_size * m.d_model)
    weight_bytes = int(read_params * dtype_bytes(weight_dtype))
    return StepCost(lin, att, weight_bytes, kv_read, kv_write)
