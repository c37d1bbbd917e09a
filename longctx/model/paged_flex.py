"""The fused attention backend: each chunk in one call, all decodes in one FlexAttention call over the pool.

Two ideas, both from how serving engines avoid the reference backend's costs (``longctx.model.attention``):

1. **A chunk after a prefix in ONE call.** Its ``n`` queries sit at the END of its ``kv_len`` keys, so query
   ``j`` sees keys ``0 … kv_len - n + j``: causal masking aligned to the bottom-right corner
   (``torch.nn.attention.bias.causal_lower_right``). On CUDA the flash / memory-efficient kernels apply it
   inside the kernel (no tiles, no mask tensor); on a CPU PyTorch materializes the ``[n, kv_len]`` mask.
2. **Decodes read the paged pool in place.** Every decode of the step is one batch row of a single
   FlexAttention call whose keys and values are the layer's whole pool, viewed ``[1, H_kv, num_slots, d]``
   (no gather, no padded copy). Which slots row ``b`` may read is said twice, consistently:
   - the block mask lists, per row, the pool blocks of its block table (compiled kernels visit only those:
     a full block without checks, the last, partly filled block through the mask function);
   - the mask function says it slot by slot: slot ``s`` is readable by row ``b`` when its block is in ``b``'s
     table (``owner_rank[b, s // block_size] >= 0``, the block's index in that table) and its position
     ``rank * block_size + s % block_size`` is below ``b``'s context length. Eager FlexAttention (a CPU)
     ignores the block lists and evaluates this function everywhere, so ownership must live in it.
   Both are built once per step (cached on the step's metadata) and shared by every layer. The mask
   function is ONE function per padded batch size over buffers refilled in place (``DecodeMask``), and on CUDA
   ``flex_attention`` is compiled with dynamic shapes, so new block tables or contexts do not recompile it: it
   compiles once per batch bucket (``tests/test_attention_backends.py`` counts the compilations).

Shapes: q [T, H, d] (the step's rows), pool k/v [num_slots, H_kv, d], block size ``bs``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from longctx.memory import blocks_for_tokens
from longctx.model.attention_ops import fresh_prompt, prefill_keys, sdpa

EAGER_WARNING = "flex_attention called without torch.compile"
_compiled = None  # flex_attention compiled for CUDA, made on first use


@dataclass
class PagedDecodes:
    """The step's decodes as FlexAttention sees them: ``rows`` [B] of the step, a ``block_mask`` over the
    pool's ``num_slots`` keys."""

    rows: torch.Tensor
    block_mask: BlockMask


class DecodeMask:
    """The mask function's state for ONE padded batch size: ``rank`` [rows, num_blocks] and ``lens`` [rows] on
    the device, refilled in place each step, and ONE ``mask_mod`` that reads them. A compiled kernel sees the
    same function and the same tensor shapes every step with this many rows, so it does not recompile."""

    def __init__(self, num_blocks: int, block_size: int, device, rows: int):
        self.num_blocks, self.block_size, self.device, self.rows = (
            num_blocks, block_size, torch.device(device), rows)
        self.rank = torch.full((rows, num_blocks), -1, dtype=torch.int32, device=self.device)
        self.lens = torch.zeros(rows, dtype=torch.int32, device=self.device)
        rank, lens, bs = self.rank, self.lens, block_size

        def readable(b, h, q_idx, kv_idx):  # slot kv_idx belongs to row b's context
            r = rank[b, kv_idx // bs]
            return (r >= 0) & (r * bs + kv_idx % bs < lens[b])

        self.mask_mod = readable

    def update(self, lens, batch_index, blocks, ranks) -> None:
        """``lens`` [rows] become this step's context lengths, and row ``batch_index[i]`` owns pool block
        ``blocks[i]`` as its ``ranks[i]``-th block (device tensors)."""
        if len(lens) != self.rows:
            raise ValueError(f"this decode mask has {self.rows} rows; got {len(lens)}")
        self.rank.fill_(-1)
        self.rank[batch_index, blocks] = ranks
        self.lens.copy_(lens)


class DecodeMasks:
    """One ``DecodeMask`` per padded batch size (``batch_bucket``), made on first use and kept: a batch that
    shrinks finds the mask function its bucket was compiled with (one buffer shared by all buckets would have
    to grow, and a grown buffer is a new function: every smaller bucket would compile again). Memory: about
    ``2 x largest bucket x num_blocks`` int32."""

    def __init__(self, num_blocks: int, block_size: int, device):
        self.num_blocks, self.block_size, self.device = num_blocks, block_size, torch.device(device)
        self.by_rows: dict[int, DecodeMask] = {}

    def for_rows(self, rows: int) -> DecodeMask:
        if rows not in self.by_rows:
            self.by_rows[rows] = DecodeMask(self.num_blocks, self.block_size, self.device, rows)
        return self.by_rows[rows]


def batch_bucket(num_decodes: int) -> int:
    """Rows the decode call is padded to: the next power of two (a compiled kernel per bucket, not per
    size)."""
    return 1 << max(0, num_decodes - 1).bit_length()


def paged_decodes(decodes, masks: DecodeMasks) -> PagedDecodes:
    """``decodes``: (row, block_table, kv_len) per decode of the step -> rows and the block mask (see module).

    The batch is padded to ``batch_bucket`` rows whose block lists are empty (their output is never read).
    Everything the device needs goes over in ONE copy of one int32 tensor."""
    B, bs = len(decodes), masks.block_size
    Bp = batch_bucket(B)
    mask_state = masks.for_rows(Bp)
    used = [blocks_for_tokens(d[2], bs) for d in decodes] + [0] * (Bp - B)
    width = max(2, max(used))  # >= 2: a width of 1 would make the compiler specialize on it
    tables = torch.zeros((Bp, width), dtype=torch.int32)
    for b, (_, table, _) in enumerate(decodes):
        tables[b, : used[b]] = torch.as_tensor(table[: used[b]], dtype=torch.int32)
    lens = torch.tensor([d[2] for d in decodes] + [0] * (Bp - B), dtype=torch.int32)
    used_t = torch.tensor(used, dtype=torch.int32)
    partial = ((lens % bs != 0) & (used_t > 0)).to(torch.int32)  # 1 when the last block is partly filled
    last = tables.gather(1, (used_t - 1).clamp(min=0).long()[:, None])[:, 0]  # [Bp]
    live = torch.arange(width)[None, :] < used_t[:, None]  # [Bp, width]
    owner = torch.arange(Bp, dtype=torch.int32)[:, None].expand(Bp, width)[live]
    rank = torch.arange(width, dtype=torch.int32).expand(Bp, width)[live]
    rows = torch.tensor([d[0] for d in decodes], dtype=torch.int32)
    parts = [lens, partial, used_t - partial, last, tables.flatten(), owner, tables[live], rank, rows]
    packed = torch.cat(parts).to(mask_state.device, non_blocking=True)  # one host-to-device copy
    lens_d, partial_d, full_d, last_d, tables_d, owner_d, blocks_d, rank_d, rows_d = packed.split(
        [len(x) for x in parts])
    mask_state.update(lens_d, owner_d.long(), blocks_d.long(), rank_d)
    mask = BlockMask.from_kv_blocks(
        partial_d.view(Bp, 1, 1), last_d.view(Bp, 1, 1, 1), full_d.view(Bp, 1, 1),
        tables_d.view(Bp, 1, 1, width),
        BLOCK_SIZE=(16, bs), mask_mod=mask_state.mask_mod, seq_lengths=(1, mask_state.num_blocks * bs),
        compute_q_blocks=False,
    )
    return PagedDecodes(rows_d.long(), mask)


def compiled_flex(qd, keys, values, block_mask):
    """The CUDA call: compiled once (dynamic widths; the padded batch static so the split-KV decoding kernel
    can run), 16 x 16 tiles to match the 16-token KV blocks, and a loud error instead of a silent eager
    fallback if the compiler ever runs out of recompilations."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=True)
    for t in (qd, block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.full_kv_num_blocks,
              block_mask.full_kv_indices):
        torch._dynamo.mark_static(t, 0)
    config = {"recompile_limit": 64}
    # the name changed between versions
    for flag in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(torch._dynamo.config, flag):
            config[flag] = True
            break
    with torch._dynamo.config.patch(**config):
        return _compiled(qd, keys, values, block_mask=block_mask, enable_gqa=True,
                         kernel_options={"BLOCK_M": 16, "BLOCK_N": 16})


class FusedBackend:
    """Chunks in one call each (bottom-right causal after a prefix), decodes in one paged FlexAttention
    call."""

    name = "fused"
    uses_decode_groups = False

    def __init__(self):
        self._masks: DecodeMasks | None = None

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None:
        if probe is not None:
            raise ValueError("the fused attention backend runs no probes: "
                             "a probed layer uses the reference backend")
        if not isinstance(k_cache, torch.Tensor):
            raise ValueError("the fused attention backend reads the pool in place: it needs a pool in the "
                             "model's dtype, not a quantized or cast one "
                             "(choose_backend with pool_in_model_dtype=False)")
        for i in meta.prefill_indices:
            start, n, kv_len = meta.q_starts[i], meta.q_lens[i], meta.kv_lens[i]
            keys, values = prefill_keys(k, v, k_cache, v_cache, meta, i)  # [1, H_kv, kv_len, d]
            if kv_len == n:
                fresh_prompt(q, keys, values, start, n, out)
                continue
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
            o = sdpa(qi, keys, values, mask=causal_lower_right(n, kv_len))
            out[start : start + n] = o.squeeze(0).transpose(0, 1)
        if meta.decodes:
            self._decodes(q, k_cache, v_cache, meta, out)

    def decode_state(self, k_cache, block_size: int, device) -> DecodeMasks:
        num_slots, num_kv_heads, head_dim = k_cache.shape
        if num_slots * num_kv_heads * head_dim >= 2**31:
            raise ValueError(f"a pool of {num_slots} slots x {num_kv_heads} KV heads x {head_dim} is past "
                             "the fused kernel's 32-bit offsets: use the reference backend or a smaller pool")
        masks = self._masks
        if masks is None or (masks.num_blocks, masks.block_size, masks.device) != (
                num_slots // block_size, block_size, torch.device(device)):
            masks = self._masks = DecodeMasks(num_slots // block_size, block_size, device)
        return masks

    def _decodes(self, q, k_cache, v_cache, meta, out) -> None:
        paged = meta.scratch.get("paged_decodes")
        if paged is None:  # once per step, for every layer
            state = self.decode_state(k_cache, meta.block_size, q.device)
            paged = meta.scratch["paged_decodes"] = paged_decodes(meta.decodes, state)
        B, Bp = len(paged.rows), paged.block_mask.kv_num_blocks.shape[0]
        qd = q.new_zeros((Bp, q.shape[1], 1, q.shape[2]))  # [Bp, H, 1, d]; pad rows stay zero
        qd[:B, :, 0] = q[paged.rows]
        keys = k_cache.permute(1, 0, 2).unsqueeze(0)  # [1, H_kv, num_slots, d], a view of the pool
        values = v_cache.permute(1, 0, 2).unsqueeze(0)
        if q.device.type == "cuda":
            o = compiled_flex(qd, keys, values, paged.block_mask)
        else:  # eager: the reference semantics, computed densely over the pool (tests, the curious)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=EAGER_WARNING)
                o = flex_attention(qd, keys, values, block_mask=paged.block_mask, enable_gqa=True)
        out[paged.rows] = o[:B, :, 0]  # [B, H, d]
