"""KV-pool planner: do ``users`` requests of ``context`` tokens fit a paged KV pool, block for block?

The arithmetic is the engine's paged block manager's (``longctx.kv.block_manager``), not the textbook's:

1. ``bytes_per_token`` (``quant.pool_bytes_per_token``): what the pool really holds per token, quantization
   scales included, for the scale layout ``kv_scales`` (see below); ``block_bytes = block_size *
   bytes_per_token``.
2. The pool is whole blocks: ``pool_blocks = floor(pool_bytes / block_bytes)``.
3. Prefix caching shares only *full* blocks: ``shared_blocks = shared_prefix // block_size`` are stored
   once; every user stores its tail, the partial prefix block included:
   ``per_user_blocks = ceil((context - shared_blocks * block_size) / block_size)``.
   ``context`` is every KV token a user holds (prompt + output), so ``shared_prefix < context``.
4. ``blocks = shared_blocks + users * per_user_blocks``; ``fits = blocks <= pool_blocks``;
   ``max_users = floor((pool_blocks - shared_blocks) / per_user_blocks)`` (0 if the prefix alone overflows).

Scale layouts (``kv_scales``; only quantized formats have scales, fp16 numbers of 2 bytes each):

- ``"per-tensor"``: one scale per layer for all keys (and one for all values), kept with the layer's
  parameters, not in the pool: 0 bytes per token. This is how vLLM's FP8 KV cache stores them
  (``k_scale`` / ``v_scale`` of each attention layer; its per-head variant, ``num_kv_heads`` scales per
  layer, is also outside the pool) and how SGLang does; see
  https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/.
- ``"per-vector"``: one scale per key (value) vector of one head, written with the token (our fp8).
- ``"per-group"``: one scale per ``quant.GROUP_SIZE`` = 32 numbers of a vector (our int8 and int4).
- ``None`` (the default): what this course's engine stores for ``kv_dtype`` (``quant.pool_bytes_per_token``,
  which ``PagedKVCache`` allocates).

Capstone (Llama-3-8B, fp8 KV, 64 users x 8,192 tokens, 2,048-token shared prefix, 48 GiB pool, 16-token
blocks, our per-vector scales):

- bytes/token = 2 x 32 layers x 8 KV heads x (128 codes + 2 scale bytes) = 66,560 B (65 KiB: 1,024 B of
  scales on top of the textbook 65,536); block = 16 x 66,560 = 1,064,960 B.
- pool = floor(48 x 2**30 / 1,064,960) = 48,395 blocks.
- shared = 2,048 / 16 = 128 blocks; per user = (8,192 - 2,048) / 16 = 384 blocks.
- blocks = 128 + 64 x 384 = 24,704 = 26,308,771,840 B = 24.502 GiB: fits, with 23.497 GiB of headroom.
- max users = floor((48,395 - 128) / 384) = 125.
- textbook number (no blocks, no scales, whole prefix shared once): 24.125 GiB
  (``memory.kv_pool_bytes(..., block_size=None)``), the source's "~24.1 GiB".
- with ``kv_scales="per-tensor"`` (vLLM's layout): 65,536 B per token, 1 MiB blocks, 49,152 of them;
  24,704 blocks = 24.125 GiB, exactly the textbook number (6,144 and 2,048 are multiples of 16, so block
  rounding costs nothing here), and max users = floor((49,152 - 128) / 384) = 127, the source's number.
  All of the 0.377 GiB between 24.502 and 24.125 GiB is our per-vector scales.

Hybrid models (sliding-window layers beside global ones, ``longctx.kv.hybrid``): the pool is the engine's
hybrid pool. A block holds ``block_size`` tokens of ONE KV-cache group's layers (``block_bytes`` is
``group_size / num_layers`` of a full-model block); each user holds ``ceil(context / block_size)`` blocks in
every global group and at most ``memory.sliding_blocks_bound(window, block_size, chunk_tokens)`` in every
sliding group (its peak, while a chunk of ``chunk_tokens`` prompt tokens is computed; the engine's default
chunk is 512). Prefix sharing is refused for them, as the engine refuses it.

Pure Python (no torch). Units: bytes (ints); ``memory.GiB = 2**30``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from longctx import memory
from longctx.checks import positive_int, positive_number
from longctx.kv import quant
from longctx.kv.hybrid import kv_cache_groups
from longctx.kv.quant import KV_SCALES, scale_layout  # noqa: F401  (re-exported: the planner's layouts)
from longctx.specs import ModelSpec, get_model


@dataclass(frozen=True)
class Plan:
    """A KV-pool plan: the inputs, then the block arithmetic (see the module docstring).

    ``headroom_bytes = pool_blocks * block_bytes - bytes`` is negative when the plan does not fit (it is
    then the shortfall). ``naive_bytes`` is the textbook number for comparison: element bytes only, no
    block rounding, the whole prefix stored once. ``scale_bytes_per_token`` is the part of
    ``bytes_per_token`` that is quantization scales; ``kv_scales`` the scale layout they follow (None for a
    plain format, which has none).
    """

    model: str
    kv_dtype: str
    kv_scales: str | None
    users: int
    context: int
    shared_prefix: int
    block_size: int
    pool_bytes: int
    bytes_per_token: int
    scale_bytes_per_token: int
    block_bytes: int
    pool_blocks: int
    shared_blocks: int
    per_user_blocks: int
    blocks: int
    bytes: int
    fits: bool
    headroom_bytes: int
    max_users: int
    naive_bytes: int
    kv_groups: int = 1  # KV-cache groups of the pool (1: full attention; a hybrid model has more)
    chunk_tokens: int | None = None  # prompt tokens computed a step, for a hybrid model's sliding groups

    @property
    def gib(self) -> float:
        return self.bytes / memory.GiB

    @property
    def pool_gib(self) -> float:
        return self.pool_bytes / memory.GiB

    def to_dict(self) -> dict:
        """The fields plus ``gib``, ``pool_gib``, ``headroom_gib`` and ``naive_gib`` (JSON-safe)."""
        d = asdict(self)
        d.update(gib=self.gib, pool_gib=self.pool_gib, headroom_gib=self.headroom_bytes / memory.GiB,
                 naive_gib=self.naive_bytes / memory.GiB)
        return d

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) rows of the human-readable table."""
        if self.scale_bytes_per_token:
            scales = f"incl. {self.scale_bytes_per_token:,} B of {self.kv_scales} scales"
        else:
            scales = "scales kept per tensor, outside the pool" if self.kv_scales else "no scales"
        prefix = (f"{self.shared_prefix:,} tokens -> {self.shared_blocks:,} full blocks stored once"
                  if self.shared_prefix else "none")
        headroom = "headroom" if self.headroom_bytes >= 0 else "shortfall"
        return [
            ("model / KV dtype", f"{self.model} / {self.kv_dtype}"
                                 + (f" ({self.kv_scales} scales)" if self.kv_scales else "")),
            ("users x context", f"{self.users:,} x {self.context:,} tokens"),
            ("shared prefix", prefix),
            ("KV per token", f"{self.bytes_per_token:,} B ({scales})"),
            ("block", f"{self.block_size} tokens = {self.block_bytes:,} B" + self._group_note()),
            ("blocks per user", f"{self.per_user_blocks:,}"),
            ("blocks needed / pool", f"{self.blocks:,} / {self.pool_blocks:,}"),
            ("KV needed / pool", f"{self.gib:,.3f} GiB / {self.pool_gib:,.3f} GiB"),
            ("fits", "yes" if self.fits else "NO"),
            (headroom, f"{abs(self.headroom_bytes) / memory.GiB:,.3f} GiB ({abs(self.headroom_bytes):,} B)"),
            ("max users", f"{self.max_users:,}"),
            ("textbook (no blocks/scales)", f"{self.naive_bytes / memory.GiB:,.3f} GiB"),
        ]

    def _group_note(self) -> str:
        return f" (one KV-cache group's layers, of {self.kv_groups})" if self.kv_groups > 1 else ""

    def __str__(self) -> str:
        rows = self.rows()
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _pool_size(pool_gib: float | None, pool_bytes: float | None) -> int:
    if (pool_gib is None) == (pool_bytes is None):
        raise ValueError("give exactly one of pool_gib or pool_bytes (the KV pool's size)")
    name, value = ("pool_gib", pool_gib) if pool_gib is not None else ("pool_bytes", pool_bytes)
    positive_number(name, value)  # (the value itself is floored below: an int stays exact)
    return math.floor(value * memory.GiB) if name == "pool_gib" else math.floor(value)


def _whole_blocks(pool: int, block_size: int, bytes_per_token: int) -> int:
    blocks = memory.blocks_that_fit(pool, block_size, bytes_per_token)
    if blocks < 1:
        raise ValueError(
            f"the pool holds no block of {block_size} tokens: pool_bytes={pool:,} < one block = "
            f"{block_size} x {bytes_per_token:,} B = {block_size * bytes_per_token:,} B; "
            "give a larger pool or "
            "a smaller block_size"
        )
    return blocks


def pool_blocks(model: ModelSpec | str, kv_dtype: str, block_size: int = 16, pool_gib: float | None = None,
                pool_bytes: float | None = None, kv_scales: str | None = None) -> int:
    """Whole blocks of ``block_size`` tokens of ``kv_dtype`` in a pool of ``pool_gib`` GiB or ``pool_bytes``
    bytes (exactly one): ``plan(...).pool_blocks`` without the users (the simulator sizes its pool with
    it; a hybrid model's block holds one KV-cache group's layers)."""
    block_size = memory.check_token_count("block_size", block_size, allow_zero=False)
    return _whole_blocks(_pool_size(pool_gib, pool_bytes), block_size, _group_bytes_per_token(
        get_model(model), quant.pool_bytes_per_token(model, kv_dtype, kv_scales)))


def _group_bytes_per_token(m: ModelSpec, bytes_per_token: int) -> int:
    """Bytes a token takes in one block of the pool: all layers' (full attention), or one KV-cache group's
    (a hybrid model's pool, ``longctx.kv.hybrid``)."""
    return bytes_per_token * len(kv_cache_groups(m)[0].layers) // m.num_layers


def plan(
    model: ModelSpec | str, kv_dtype: str, users: int, context: int, shared_prefix: int = 0,
    block_size: int = 16, pool_gib: float | None = None, pool_bytes: float | None = None,
    kv_scales: str | None = None, chunk_tokens: int = 512,
) -> Plan:
    """Plan a paged KV pool for ``users`` requests of ``context`` KV tokens each (prompt + output), the
    first ``shared_prefix`` of them common to all, in blocks of ``block_size`` tokens, in a pool of
    ``pool_gib`` GiB or ``pool_bytes`` bytes (exactly one), with quantization scales stored as ``kv_scales``
    says (``"per-tensor"``, ``"per-vector"``, ``"per-group"``; None: as this course's engine stores them).
    ``chunk_tokens``: prompt tokens computed a step (a hybrid model's sliding groups hold the window and the
    chunk). Raises ``ValueError`` on bad input."""
    m = get_model(model)
    fmt = quant.get_format(kv_dtype)
    users = positive_int("users", users, floats=False, what="an integer >= 1")
    context = memory.check_token_count("context", context, allow_zero=False)
    shared_prefix = memory.check_token_count("shared_prefix", shared_prefix)
    if shared_prefix >= context:
        raise ValueError(
            f"shared_prefix ({shared_prefix}) must be < context ({context}): the prefix is part of each "
            "user's context, which also holds its own output"
        )
    block_size = memory.check_token_count("block_size", block_size, allow_zero=False)
    chunk_tokens = positive_int("chunk_tokens", chunk_tokens, floats=False, what="an integer >= 1")
    pool = _pool_size(pool_gib, pool_bytes)
    groups = kv_cache_groups(m)
    if len(groups) > 1 and shared_prefix:
        raise ValueError(f"{m.name} has sliding-window layers: the engine does not share prefix blocks for "
                         "it (no prefix caching); give shared_prefix=0")

    layout = scale_layout(fmt.name, kv_scales)
    bpt = quant.pool_bytes_per_token(m, fmt.name, layout)  # raises if per-group scales do not divide head_dim
    group_bpt = _group_bytes_per_token(m, bpt)  # a block holds one group's layers
    block_bytes = block_size * group_bpt
    pool_blocks = _whole_blocks(pool, block_size, group_bpt)
    shared_tokens, own_tokens = memory.split_prefix(context, shared_prefix, block_size)  # whole blocks both
    shared_blocks, per_user_blocks = shared_tokens // block_size, own_tokens // block_size  # per user >= 1
    if len(groups) > 1:
        sliding = memory.sliding_blocks_bound(m.sliding_window, block_size, min(chunk_tokens, context))
        per_user_blocks = sum(per_user_blocks if g.window is None else min(per_user_blocks, sliding)
                              for g in groups)
    blocks = shared_blocks + users * per_user_blocks
    total = blocks * block_bytes
    max_users = max(0, (pool_blocks - shared_blocks) // per_user_blocks)
    return Plan(
        model=m.name, kv_dtype=fmt.name, kv_scales=layout, users=users, context=context,
        shared_prefix=shared_prefix, block_size=block_size, pool_bytes=pool, bytes_per_token=bpt,
        scale_bytes_per_token=bpt - memory.kv_bytes_per_token(m, fmt.name), block_bytes=block_bytes,
        pool_blocks=pool_blocks, shared_blocks=shared_blocks, per_user_blocks=per_user_blocks, blocks=blocks,
        bytes=total, fits=blocks <= pool_blocks, headroom_bytes=pool_blocks * block_bytes - total,
        max_users=max_users,
        naive_bytes=memory.kv_pool_bytes(m, users, context, fmt.name, shared_prefix, block_size=None),
        kv_groups=len(groups), chunk_tokens=chunk_tokens if len(groups) > 1 else None,
    )
