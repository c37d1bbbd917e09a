"""KV-cache formats: what one key (or value) vector of one head costs in the paged pool, and how it is stored.

A K or V vector of ``d_head`` numbers is stored either plainly (fp32, fp16, bf16: ``d_head`` elements) or
quantized with scales (the serving engines' FP8 / INT8 / INT4 KV caches):

======  ===========================================  ======================================  ==========
format  codes                                         scales (fp16, 2 bytes each)             d_head=128
======  ===========================================  ======================================  ==========
fp8     E4M3 (1 byte), ``x / s`` with s = amax / 448  one per vector (token x head)           128 + 2
int8    round(x / s) in [-127, 127] (1 byte)          one per group of 32 numbers             128 + 8
int4    round(x / s) in [-7, 7], two per byte          one per group of 32 numbers             64 + 8
======  ===========================================  ======================================  ==========

Scales are computed per vector (or group) as each token is written (dynamic, symmetric, no zero point),
so the bytes per token are a little more than ``d_head x bits / 8``: the 1.6 % (fp8), 6 % (int8) and
12.5 % (int4) of scales at ``d_head = 128`` are real memory that a plan must count.
``longctx.memory.kv_bytes_per_token`` counts elements only (the textbook number);
:func:`pool_bytes_per_token` counts what the pool really holds (``longctx.plan`` uses it, the engine's
``PagedKVCache`` allocates it, and a test checks the two agree).

The torch part (``quantize`` / ``dequantize``) is used by ``longctx.kv.cache``; this module imports torch
lazily so the planner stays pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_BYTES = 2  # scales are stored in fp16
GROUP_SIZE = 32  # numbers per scale for int8 / int4
FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass(frozen=True)
class KVFormat:
    """One KV storage format. ``bits`` per number; ``group_size`` numbers share a scale (None: the whole
    vector shares one; 0: no scale, a plain float format)."""

    name: str
    bits: int
    group_size: int | None
    description: str

    @property
    def quantized(self) -> bool:
        return self.group_size != 0

    def groups(self, head_dim: int) -> int:
        """Scales per vector of ``head_dim`` numbers (0 for a plain format)."""
        if not self.quantized:
            return 0
        if self.group_size is None:
            return 1
        if head_dim % self.group_size:
            raise ValueError(
                f"the {self.name} KV format groups {self.group_size} numbers per scale, which does not "
                f"divide head_dim={head_dim}; allowed for this model: "
                f"{', '.join(n for n in FORMATS if _fits(n, head_dim))}"
            )
        return head_dim // self.group_size

    def code_bytes(self, head_dim: int) -> int:
        """Bytes of the codes of one vector."""
        if head_dim * self.bits % 8:
            raise ValueError(
                f"{self.name} packs {8 // self.bits} numbers per byte; head_dim={head_dim} is odd"
            )
        return head_dim * self.bits // 8


FORMATS: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", 32, 0, "float32, no quantization"),
    "fp16": KVFormat("fp16", 16, 0, "float16, no quantization"),
    "bf16": KVFormat("bf16", 16, 0, "bfloat16, no quantization"),
    "fp8": KVFormat("fp8", 8, None, "float8 E4M3 with one fp16 scale per token and head"),
    "int8": KVFormat("int8", 8, GROUP_SIZE, "int8, symmetric, one fp16 scale per 32 numbers"),
    "int4": KVFormat("int4", 4, GROUP_SIZE, "int4 in [-7, 7], two per byte, one fp16 scale per 32 numbers"),
}


def _fits(name: str, head_dim: int) -> bool:
    fmt = FORMATS[name]
    return not fmt.quantized or fmt.group_size is None or head_dim % fmt.group_size == 0


def get_format(kv_dtype: str | KVFormat) -> KVFormat:
    """The ``KVFormat`` of a name (``fp32``, ``fp16``, ``bf16``, ``fp8``, ``int8``, ``int4``)."""
    if isinstance(kv_dtype, KVFormat):
        return kv_dtype
    key = str(kv_dtype).lower()
    if key not in FORMATS:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; allowed: {', '.join(FORMATS)}")
    return FORMATS[key]


# the layouts ``kv_scales`` accepts (None: the engine's)
KV_SCALES = ("per-tensor", "per-vector", "per-group")


def scale_layout(kv_dtype: str, kv_scales: str | None = None) -> str | None:
    """The scale layout a pool of ``kv_dtype`` uses: ``kv_scales`` checked, or the engine's own when None
    (``"per-vector"`` for fp8, ``"per-group"`` for int8 / int4); None for a plain format (fp32, fp16, bf16),
    which has no scales (``"per-tensor"`` is accepted there too: it stores nothing per token either)."""
    fmt = get_format(kv_dtype)
    if kv_scales is not None:
        key = str(kv_scales).lower()
        if key not in KV_SCALES:
            raise ValueError(
                f"unknown kv_scales {kv_scales!r}; allowed: {', '.join(KV_SCALES)} (or None: the engine's)"
            )
        if not fmt.quantized:
            if key != "per-tensor":
                quantized = ", ".join(n for n, f in FORMATS.items() if f.quantized)
                raise ValueError(
                    f"{fmt.name} stores plain numbers, no scales: kv_scales={key!r} applies to the "
                    f"quantized formats only ({quantized})"
                )
            return None
        return key
    if not fmt.quantized:
        return None
    return "per-vector" if fmt.group_size is None else "per-group"


def pool_bytes_per_token(model, kv_dtype: str, kv_scales: str | None = None) -> int:
    """Bytes one token takes in a paged pool of ``kv_dtype`` with scale layout ``kv_scales`` (``model``: a
    ``ModelSpec`` or a registered name): ``2 x L x H_kv x (code bytes + scales per vector x 2)``, with 0
    scales per vector for ``"per-tensor"``, 1 for ``"per-vector"``, ``head_dim / 32`` for ``"per-group"``.
    With ``kv_scales=None`` the engine's layout: what ``PagedKVCache`` allocates. The one place the pool's
    bytes per token are counted (``longctx.plan`` calls it ``bytes_per_token``); the formula is
    ``memory.kv_bytes_per_token``'s, given the scale bytes per vector."""
    from longctx.memory import kv_bytes_per_token
    from longctx.specs import get_model

    m, fmt = get_model(model), get_format(kv_dtype)
    layout = scale_layout(fmt.name, kv_scales)
    if kv_scales is None:  # the engine's own layout
        scales = fmt.groups(m.head_dim)
    elif layout is None or layout == "per-tensor":
        scales = 0
    elif layout == "per-vector":
        scales = 1
    else:
        if m.head_dim % GROUP_SIZE:
            raise ValueError(
                f"per-group scales take one scale per {GROUP_SIZE} numbers, which does not divide "
                f"{m.name}'s head_dim={m.head_dim}; use per-vector or per-tensor"
            )
        scales = m.head_dim // GROUP_SIZE
    fmt.code_bytes(m.head_dim)  # raises where the codes do not fill whole bytes (int4 with an odd head_dim)
    return kv_bytes_per_token(m, fmt.name, scales * SCALE_BYTES)


# ---- torch: quantize on write, dequantize on read ----

def quantize(x, fmt: KVFormat):
    """``x`` [..., d] (float) -> ``(codes, scales)``: codes uint8 [..., code_bytes], scales fp16 [...,
    groups].

    Symmetric per group: ``s = amax / qmax`` rounded to fp16 (codes computed with the rounded scale and
    clamped, so rounding never overflows a code); an all-zero group gets ``s = 0`` and codes 0."""
    import torch

    d = x.shape[-1]
    g = fmt.groups(d)
    xg = x.float().reshape(*x.shape[:-1], g, d // g)  # [..., groups, group]
    qmax = FP8_MAX if fmt.name == "fp8" else float(2 ** (fmt.bits - 1) - 1)
    scales = (xg.abs().amax(-1) / qmax).to(torch.float16)  # [..., groups]
    s = scales.float().unsqueeze(-1)
    y = torch.where(s > 0, xg / torch.where(s > 0, s, 1.0), 0.0).clamp(-qmax, qmax).reshape(x.shape)
    if fmt.name == "fp8":
        codes = y.to(torch.float8_e4m3fn).view(torch.uint8)
    elif fmt.bits == 8:
        codes = y.round().to(torch.int8).view(torch.uint8)
    else:  # int4: q + 8 in 1..15, even index in the low nibble
        q = (y.round() + 8).to(torch.uint8)
        codes = q[..., 0::2] | (q[..., 1::2] << 4)
    return codes, scales


def dequantize(codes, scales, fmt: KVFormat, dtype):
    """Inverse of :func:`quantize`: ``codes`` [..., code_bytes], ``scales`` [..., groups] -> [..., d] in
    ``dtype``."""
    import torch

    if fmt.name == "fp8":
        y = codes.view(torch.float8_e4m3fn).float()
    elif fmt.bits == 8:
        y = codes.view(torch.int8).float()
    else:
        lo = (codes & 15).float() - 8
        hi = (codes >> 4).float() - 8
        y = torch.stack([lo, hi], dim=-1).flatten(-2)  # interleave back: [..., d]
    g = scales.shape[-1]
    d = y.shape[-1]
    out = y.reshape(*y.shape[:-1], g, d // g) * scales.float().unsqueeze(-1)
    return out.reshape(y.shape).to(dtype)


def error_bound(x, fmt: KVFormat):
    """The largest |x - dequantize(quantize(x))| each element may have (tests use it): half a step
    for int8 / int4 (step = the group's scale), E4M3's half-ulp (2^-4 relative, 2^-10 x s absolute below the
    normal range) for fp8; plus ``qmax x 2^-24`` for a tiny group (amax below ``qmax x 2^-14``), whose fp16
    scale is subnormal or zero."""
    import torch

    d = x.shape[-1]
    g = fmt.groups(d)
    xg = x.float().reshape(*x.shape[:-1], g, d // g)
    qmax = FP8_MAX if fmt.name == "fp8" else float(2 ** (fmt.bits - 1) - 1)
    s = (xg.abs().amax(-1, keepdim=True) / qmax) * (1 + 2**-10)  # fp16 rounding of the scale
    if fmt.name == "fp8":
        bound = xg.abs() * 2**-4 + s * 2**-9
    else:
        bound = (s / 2).expand_as(xg).clone()
    return (bound * 1.001 + qmax * 2**-24).reshape(x.shape).to(torch.float32)
