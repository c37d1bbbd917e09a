"""A measured GEMM profile: this machine's time for each of a model's weight matrices (and its small per-token
ops) at each row count.

Vidur prices a GPU step from profiled operators rather than from a roofline; ``GemmProfile`` does the same
for the real engine on a CPU. A roofline cannot follow a CPU GEMM library's row-count choices: on one 2-core
VM (Intel Xeon) ``torch.nn.functional.linear`` streamed the weights once per 3 rows below 16 rows; on another
(AMD EPYC) 3 rows took twice as long as 4 through SmolLM2's LM head (36.7 vs 18.1 ms), because 1-3 rows run
as separate matrix-vector products and 4 as one blocked kernel. A fit of efficiencies to such a stair is a
compromise that differs from machine to machine; a profile of the machine is not.

``measure_gemm_profile(model)`` times, for every row count asked, the GEMMs the engine runs in one step
(``longctx.model.llama``: q, k and v projections, o, gate and up, down, per layer; the LM head once), as the
engine runs them: each layer its own weights, so the weights stream from memory as they do in a step rather
than sitting in cache. Beside the GEMMs it times, with the engine's own functions:

- ``small_ops``: both RMSNorms, RoPE on q and k, SiLU times up, the two residual adds and the KV-cache write
  of every layer. In eager torch each is several passes over the activations, which a bytes-moved roofline
  prices at one (on the AMD VM: 2.2 times the roofline at 512 rows, 10-13 times at 1-4 rows).
- ``causal_attention``: the attention of one fresh prompt chunk of ``rows`` tokens in every layer (nothing
  cached: one fused causal ``scaled_dot_product_attention``, the engine's path for it). A chunk after a cached
  prefix (masked, in query tiles) and a decode take other paths; one attention efficiency fitted on the
  former priced fresh 512-token chunks 13 % too slow (``benchmarks/sim_fidelity.py``).

Seconds are summed per group over all layers (the LM head: once, for ``rows`` logit rows) and the median of
``repeats`` passes kept.

``GemmProfile.seconds_at(group, rows)`` is exact at a measured row count, linear between two, proportional
below the first and along the last two's slope beyond the last. ``CostModelExecutor(..., gemm_profile=p)``
prices a step's GEMMs, small ops, LM head and fresh chunks' attention from it (``longctx.sim.cost_model``);
the attention of decodes and of chunks after a prefix, the embedding and the step overheads stay modelled.
torch is imported by ``measure_gemm_profile`` only.
"""

from __future__ import annotations

import bisect
import statistics
import time
from dataclasses import dataclass, field

from longctx.checks import positive_int
from longctx.specs import ModelSpec, get_model

GROUPS = ("qkv", "o", "gate_up", "down", "small_ops", "lm_head", "causal_attention")
LAYER_GROUPS = GROUPS[:5]  # summed over all layers for a step's tokens; the LM head once per logit row
DEFAULT_ROWS = (*range(1, 17), 20, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640)


@dataclass(frozen=True)
class GemmProfile:
    """Measured seconds per GEMM group (``GROUPS``) at each of ``rows`` (ascending); ``source`` says where."""

    model: str
    rows: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]
    source: str = ""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        rows = tuple(self.rows)
        for r in rows:
            positive_int("GemmProfile rows", r, floats=False)
        if len(rows) < 2 or list(rows) != sorted(set(rows)):
            raise ValueError(f"GemmProfile rows must be at least two ascending row counts, got {rows!r}")
        if set(self.seconds) != set(GROUPS):
            raise ValueError(f"GemmProfile seconds must have exactly the groups {', '.join(GROUPS)}; "
                             f"got {', '.join(sorted(self.seconds))}")
        for g, ts in self.seconds.items():
            if len(ts) != len(rows) or not all(isinstance(t, (int, float)) and t > 0 for t in ts):
                raise ValueError(
                    f"GemmProfile seconds[{g!r}] must be {len(rows)} times > 0, one per row count"
                )

    def seconds_at(self, group: str, rows: int) -> float:
        """Seconds of ``group`` for ``rows`` token rows: exact at a measured count, linear between two,
        proportional below the first, and beyond the last along the last two's slope (never below the
        last)."""
        key = (group, rows)
        t = self._cache.get(key)
        if t is None:
            if group not in self.seconds:
                raise ValueError(f"unknown GEMM group {group!r}; allowed: {', '.join(GROUPS)}")
            xs, ys = self.rows, self.seconds[group]
            i = bisect.bisect_left(xs, rows)
            if rows <= 0:
                t = 0.0
            elif i < len(xs) and xs[i] == rows:
                t = ys[i]
            elif i == 0:
                t = ys[0] * rows / xs[0]
            elif i == len(xs):
                t = max(ys[-1], ys[-1] + (ys[-1] - ys[-2]) * (rows - xs[-1]) / (xs[-1] - xs[-2]))
            else:
                t = ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])
            self._cache[key] = t
        return t

    @classmethod
    def median_of(cls, profiles) -> GemmProfile:
        """The element-wise median of several measurements of one model's profile at the same row counts."""
        profiles = list(profiles)
        if not profiles or len({(p.model, p.rows) for p in profiles}) != 1:
            raise ValueError("median_of needs one or more profiles of one model at the same row counts")
        first = profiles[0]
        seconds = {
            g: tuple(statistics.median(col) for col in zip(*(p.seconds[g] for p in profiles), strict=True))
            for g in GROUPS
        }
        return cls(
            first.model, first.rows, seconds, f"median of {len(profiles)} profiles; each {first.source}"
        )

    @staticmethod
    def spread_of(profiles) -> dict[str, float]:
        """Per group, the median over row counts of ``max / min - 1`` across ``profiles`` (how steady they
        were)."""
        profiles = list(profiles)
        return {
            g: statistics.median(
                max(col) / min(col) - 1 for col in zip(*(p.seconds[g] for p in profiles), strict=True)
            )
            for g in GROUPS
        }

    def to_dict(self) -> dict:
        return {
            "model": self.model, "rows": list(self.rows),
            "seconds": {g: list(v) for g, v in self.seconds.items()}, "source": self.source,
        }

    @classmethod
    def from_dict(cls, d: dict) -> GemmProfile:
        return cls(
            d["model"], tuple(d["rows"]), {g: tuple(v) for g, v in d["seconds"].items()}, d.get("source", "")
        )


_WEIGHTS_OF_GROUP = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def _timed_pass(layers, norms, caches, head, t: dict, ops) -> dict[str, float]:
    """Seconds of one pass over every layer of each group in ``GROUPS`` at the inputs ``t`` (tensors of one
    row count); ``ops``: ``(torch.nn.functional, apply_rope, sdpa)``."""
    F, apply_rope, sdpa = ops
    x_d, x_ff, q, kv = t["x_d"], t["x_ff"], t["q"], t["kv"]
    acc = dict.fromkeys(GROUPS, 0.0)
    for layer, (n1, n2), (kc, vc) in zip(layers, norms, caches, strict=True):
        for g, names in _WEIGHTS_OF_GROUP.items():
            x = x_ff if g == "down" else x_d
            t0 = time.perf_counter()
            for name in names:
                F.linear(x, layer[name])
            acc[g] += time.perf_counter() - t0
        t0 = time.perf_counter()  # the layer's small ops, as longctx.model.llama runs them
        normed = n1(x_d)
        apply_rope(q, t["cos"], t["sin"])
        apply_rope(kv, t["cos"], t["sin"])
        kc[t["slots"]] = kv
        vc[t["slots"]] = kv
        h = x_d + normed  # attention's residual add
        normed = n2(h)
        F.silu(x_ff) * x_ff
        h + normed  # the MLP's residual add
        acc["small_ops"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    F.linear(x_d, head)
    acc["lm_head"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in layers:  # one fresh chunk's attention in every layer, as Attention._prefill runs it
        t["att"][:] = sdpa(t["qh"], t["kh"], t["kh"], is_causal=True).squeeze(0).transpose(0, 1)
    acc["causal_attention"] = time.perf_counter() - t0
    return acc


def measure_gemm_profile(model: ModelSpec | str = "smollm2-135m", rows=DEFAULT_ROWS, repeats: int = 3,
                         dtype: str = "fp32", seed: int = 0) -> GemmProfile:
    """This machine's ``GemmProfile`` of ``model``'s GEMMs (module docstring); uses torch's current
    threads."""
    import torch
    import torch.nn.functional as F

    from longctx.model.attention import sdpa
    from longctx.model.llama import RMSNorm, apply_rope, rope_cos_sin

    m = get_model(model)
    repeats = positive_int("repeats", repeats, floats=False)
    rows = tuple(sorted({positive_int("rows", r, floats=False) for r in rows}))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator().manual_seed(seed)
    d, hd, ff = m.d_model, m.head_dim, m.intermediate_size

    def w(out_features: int, in_features: int):
        return torch.randn(out_features, in_features, generator=gen, dtype=torch.float32).to(torch_dtype)

    layers = [{"q": w(m.num_heads * hd, d), "k": w(m.num_kv_heads * hd, d), "v": w(m.num_kv_heads * hd, d),
               "o": w(d, m.num_heads * hd), "gate": w(ff, d), "up": w(ff, d), "down": w(d, ff)}
              for _ in range(m.num_layers)]
    head = w(m.vocab_size, d)
    norms = [(RMSNorm(d, 1e-5, dtype=torch_dtype), RMSNorm(d, 1e-5, dtype=torch_dtype)) for _ in layers]
    slots = max(rows)
    caches = [(torch.zeros(slots, m.num_kv_heads, hd, dtype=torch_dtype),
               torch.zeros(slots, m.num_kv_heads, hd, dtype=torch_dtype)) for _ in layers]
    out: dict[str, list[float]] = {g: [] for g in GROUPS}
    with torch.inference_mode():
        for n in rows:
            x_d = torch.randn(n, d, generator=gen).to(torch_dtype)
            x_ff = torch.randn(n, ff, generator=gen).to(torch_dtype)
            q = torch.randn(n, m.num_heads, hd, generator=gen).to(torch_dtype)
            kv = torch.randn(n, m.num_kv_heads, hd, generator=gen).to(torch_dtype)
            cos, sin = rope_cos_sin(torch.arange(n), hd, m.rope_theta, torch_dtype)
            slot_mapping = torch.arange(n)
            qh, kh = q.transpose(0, 1).unsqueeze(0), kv.transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
            att = torch.empty_like(q)
            passes: dict[str, list[float]] = {g: [] for g in GROUPS}
            t = {"x_d": x_d, "x_ff": x_ff, "q": q, "kv": kv, "cos": cos, "sin": sin, "slots": slot_mapping,
                 "qh": qh, "kh": kh, "att": att}
            for rep in range(repeats + 1):  # the first pass warms up
                acc = _timed_pass(layers, norms, caches, head, t, (F, apply_rope, sdpa))
                if rep:
                    for g in GROUPS:
                        passes[g].append(acc[g])
            for g in GROUPS:
                out[g].append(statistics.median(passes[g]))
    source = (f"measured by longctx.sim.gemm_profile on this machine: torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads, {dtype}, median of {repeats} passes")
    return GemmProfile(m.name, rows, {g: tuple(v) for g, v in out.items()}, source)


__all__ = ["DEFAULT_ROWS", "GROUPS", "LAYER_GROUPS", "GemmProfile", "measure_gemm_profile"]
