"""The linear part of a step, operator by operator: each weight matrix and each small per-token op.

One layer runs four GEMMs over the step's ``n`` new tokens (fused as the profiles fuse them) and a few
small per-token ops. At tensor parallelism ``tp`` each GPU holds a slice of every matrix, as Megatron
splits them and as Vidur's profiles measure them: QKV and gate+up by output columns, O and down by input
rows (the all-reduces are not included). Per GPU, with ``d = d_model``, ``hd = head_dim``::

    GEMM      k (inputs)         m (outputs)                  FLOPs           bytes
    qkv       d                  (H_q + 2 H_kv) hd / tp       2 n k m         b_w k m + b_a n (k + m)
    o         H_q hd / tp        d
    gate_up   d                  (2 if gated else 1) d_ff / tp
    down      d_ff / tp          d
    lm_head   d                  vocab / tp                   (rows: logit rows, not n)

    small op (per token)     bytes moved per token
    norm (x norms/layer)     2 d b_a                    read x, write x
    rope                     2 (H_q + H_kv) hd / tp b_a  rotate q and k in place
    activation               (3 if gated else 2) d_ff / tp b_a
    residual add (x 2)       3 d b_a                    read two, write one
    embedding (per step)     2 d b_a                    gather rows, write them

Time of one GEMM (``CostFactors``: efficiencies ``ce``, ``me``; ``serial_fraction`` s; ``gemm_tile_tokens``
T; ``gemm_wave_sms`` S; ``kernel_overhead_s`` o)::

    tiles(tn) = ceil(n / T) * ceil(m / tn)                     # output tiles of T x tn, tn in (256, 128)
    waves(tn) = tiles / S if tiles <= S else ceil(tiles / S)   # tiles run S at a time, one per SM
    compute_s = 2 * k * min over tn of [waves(tn) * S * T * tn] / (peak * ce)
    memory_s  = bytes / (bandwidth * me)
    time_s    = o + max(compute_s, memory_s) + s * min(compute_s, memory_s)

Tensor cores compute whole output tiles (T = 128 rows of tokens by 256 or 128 columns: the shapes Hopper
GEMM kernels use), S tiles at a time (one per SM: S = 132 on an H100 SXM), so a GEMM takes whole *waves*:
one more token past a wave boundary costs a whole wave (512 -> 520 tokens through an 8,192-wide matrix: 128
tiles of 128 x 256 fill one wave, 160 need two). The library picks the tile width that needs the least tile
area; under one wave it splits K to fill the SMs (fractional waves). ``T = 1`` drops tile and wave
quantization (``compute_s = 2 n k m / (peak ce)``). The fit on Vidur's profiles (``longctx.sim.calibration``)
chose this form: at TP 1, 64 ... 4,096 tokens, the linear time misses by more than 15 % at 54 of 1,245
profiled points, against 92 when rows are only rounded to 128 (and S = 114 or 144 fits worse than 132). What
it cannot follow is the library's own kernel choices (e.g. a gate+up 44,032 wide twice as slow for 328 ...
384 tokens as for 448): ``benchmarks/sim_profiles.py`` names those points. The form, not the fit, is the
limit: over 20,280 sets of the four GEMM factors (``benchmarks/sim_profiles.py``) the smallest worst error
at TP 1 is 21.1 % (76 points over 15 %), the fewest misses 29 (worst 25.0 %); T = 64 or 256 and S = 114 or
144 do no better (worst 22.0-25.9 %). Fitted on four models and scored on the fifth, those two criterion
fits miss 101 and 145 held-out points, least squares 60: it is the one kept.

s = 0 is the ideal roofline (compute and memory overlap perfectly); s = 1 is no overlap. Near the ridge
point real GEMMs lose efficiency: both terms matter there, which is what s > 0 expresses. A small op costs
``elementwise_overhead_s + bytes / (bandwidth * elementwise_efficiency)``. Pure Python: no torch.
"""

from __future__ import annotations

import math

from longctx.checks import positive_int
from longctx.sim.factors import GEMM_WAVE_SMS
from longctx.specs import ModelSpec


def ffn_size(m: ModelSpec) -> float:
    """``m``'s MLP width for the operator costs: ``intermediate_size``, or for a model known only by its
    parameter count (the source's teaching 7B) the ``d_ff`` that makes its layers' matrices hold all of
    ``num_params``: ``d_ff = (N / L - d (2 H_q + 2 H_kv) hd) / (3 d)`` (12,341 for the teaching 7B)."""
    if m.intermediate_size is None or m.vocab_size is None:
        attn = m.d_model * (2 * m.num_heads + 2 * m.num_kv_heads) * m.head_dim
        return (m.num_params / m.num_layers - attn) / (3 * m.d_model)
    return m.intermediate_size


def lm_head_rows(m: ModelSpec) -> int:
    """The LM head's output width (``vocab_size``), 0 when unknown (then no LM head is priced, as
    ``longctx.flops`` counts a model known only by its parameter count)."""
    return 0 if m.intermediate_size is None or m.vocab_size is None else m.vocab_size


def gemm_dims(m: ModelSpec, tp: int = 1) -> dict[str, tuple[float, float]]:
    """``{gemm: (k, m)}`` of one layer of ``m`` on one of ``tp`` GPUs (module docstring's table)."""
    hd, d, ff = m.head_dim, m.d_model, ffn_size(m)
    up = (2 if m.gated_mlp else 1) * ff
    return {"qkv": (d, (m.num_heads + 2 * m.num_kv_heads) * hd / tp), "o": (m.num_heads * hd / tp, d),
            "gate_up": (d, up / tp), "down": (ff / tp, d)}


def small_op_bytes_per_token(m: ModelSpec, act_bytes: float, tp: int = 1) -> float:
    """Bytes per token of one layer's small ops on one GPU: norms, RoPE, activation, two residual adds."""
    d, hd = m.d_model, m.head_dim
    norms = m.norms_per_layer * 2 * d
    rope = 2 * (m.num_heads + m.num_kv_heads) * hd / tp
    act = (3 if m.gated_mlp else 2) * ffn_size(m) / tp
    return (norms + rope + act + 2 * 3 * d) * act_bytes


def small_ops_per_layer(m: ModelSpec) -> int:
    """Kernels of a layer's small ops: the norms, RoPE, the activation and two residual adds."""
    return m.norms_per_layer + 4


def check_tp(tp: object) -> int:
    return positive_int("tp (tensor-parallel degree)", tp, floats=False)


GEMM_TILE_COLUMNS = (256, 128)  # output columns of a GEMM tile: the library picks the cheaper (docstring)


def gemm_tile_area(n: int, m: float, tile: int, sms: int) -> float:
    """Output elements the tensor cores compute for ``n x m``: whole tiles, in whole waves (module
    docstring)."""
    if tile == 1:
        return n * m
    best = math.inf
    for tn in GEMM_TILE_COLUMNS:
        tiles = math.ceil(n / tile) * math.ceil(m / tn)
        waves = tiles / sms if tiles <= sms else math.ceil(tiles / sms)
        best = min(best, waves * sms * tile * tn)
    return best


def gemm_time_s(n: int, k: float, m: float, factors, peak: float, bandwidth: float,
                weight_bytes: float, act_bytes: float) -> float:
    """One GEMM of ``n`` token rows through a ``k x m`` weight (module docstring's formula), in seconds."""
    compute_s, memory_s = gemm_ideal_s(n, k, m, factors.gemm_tile_tokens, peak, bandwidth, weight_bytes,
                                       act_bytes, factors.gemm_wave_sms)
    compute_s /= factors.compute_efficiency
    memory_s /= factors.memory_efficiency
    hi, lo = (compute_s, memory_s) if compute_s >= memory_s else (memory_s, compute_s)
    return factors.kernel_overhead_s + hi + factors.serial_fraction * lo


def gemm_ideal_s(n: int, k: float, m: float, tile: int, peak: float, bandwidth: float,
                 weight_bytes: float, act_bytes: float, sms: int = GEMM_WAVE_SMS) -> tuple[float, float]:
    """``(compute_s, memory_s)`` of one GEMM at efficiency 1: what a fit scales by ``1 / efficiency``."""
    return (2.0 * k * gemm_tile_area(n, m, tile, sms) / peak,
            (weight_bytes * k * m + act_bytes * n * (k + m)) / bandwidth)


def layers_time_s(shape: ModelSpec, n: int, factors, peak: float, bandwidth: float, weight_bytes: float = 2.0,
                  act_bytes: float = 2.0, tp: int = 1) -> float:
    """Linear time of ``n`` tokens on one of ``tp`` GPUs: ``L * (4 GEMMs + small ops) + embedding``, seconds.

    No LM head and no attention: what Vidur's profiles measure (``longctx.sim.profiles``).
    """
    gemms = sum(gemm_time_s(n, k, m, factors, peak, bandwidth, weight_bytes, act_bytes)
                for k, m in gemm_dims(shape, tp).values())
    return shape.num_layers * gemms + small_ops_time_s(shape, n, factors, bandwidth, act_bytes, tp)


def small_ops_time_s(shape: ModelSpec, n: int, factors, bandwidth: float, act_bytes: float = 2.0,
                     tp: int = 1) -> float:
    """All layers' small per-token ops and the embedding for ``n`` tokens on one of ``tp`` GPUs, seconds."""
    ebw = bandwidth * factors.elementwise_efficiency
    small = (small_ops_per_layer(shape) * factors.elementwise_overhead_s
             + n * small_op_bytes_per_token(shape, act_bytes, tp) / ebw)
    return shape.num_layers * small + embedding_time_s(shape, n, factors, bandwidth, act_bytes)


def embedding_time_s(shape: ModelSpec, n: int, factors, bandwidth: float, act_bytes: float = 2.0) -> float:
    """The embedding lookup of ``n`` tokens (once a step): gather ``n`` rows of ``d_model``, write them."""
    return factors.elementwise_overhead_s + n * 2 * shape.d_model * act_bytes / (
        bandwidth * factors.elementwise_efficiency
    )
