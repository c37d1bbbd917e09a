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
     ``rank * block_size + s % block_size`` is below ``b``'s context length. Eager FlexAttention (a CPU) ignores
     the block lists and evaluates this function everywhere, so ownership must live in it.
   Both are built once per step (cached on the step's metadata) and shared by every layer. The mask
   function is ONE function over buffers refilled in place (``DecodeMask``), and on CUDA ``flex_attention``
   is compiled once with dynamic shapes, so a new batch size or new block tables do not recompile it.

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

_EAGER_WARNING = "flex_attention called without torch.compile"
_compiled = None


def _flex():
    """``flex_attention`` compiled once for CUDA (dynamic shapes)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=True)
    return _compiled


@dataclass
class PagedDecodes:
    """The step's decodes as FlexAttention sees them: ``rows`` [B] of the step, a ``block_mask`` over the
    pool's ``num_slots`` keys."""

    rows: torch.Tensor
    block_mask: BlockMask


def block_ranks(tables: torch.Tensor, used: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """``[B, num_blocks]``: the index of pool block ``p`` in row ``b``'s block table, -1 where ``b`` does not use
    it. ``tables`` [B, width] (padded), ``used`` [B] blocks that hold each context."""
    B, width = tables.shape
    live = torch.arange(width)[None, :] < used[:, None]  # [B, width]
    rank = torch.full((B, num_blocks), -1, dtype=torch.int32)
    batch_index = torch.arange(B)[:, None].expand(B, width)
    rank[batch_index[live], tables[live].long()] = torch.arange(width, dtype=torch.int32).expand(B, width)[live]
    return rank


class DecodeMask:
    """The mask function's state, kept across steps: ``rank`` [capacity, num_blocks] and ``lens`` [capacity]
    on the device, refilled in place each step, and ONE ``mask_mod`` that reads them. A compiled kernel sees
    the same function and the same tensor shapes every step (no recompilation); only a batch larger than
    ``capacity`` reallocates (capacity doubles)."""

    def __init__(self, num_blocks: int, block_size: int, device, capacity: int = 8):
        self.num_blocks, self.block_size, self.device = num_blocks, block_size, torch.device(device)
        self.capacity = 0
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        self.capacity = capacity
        self.rank = torch.full((capacity, self.num_blocks), -1, dtype=torch.int32, device=self.device)
        self.lens = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        rank, lens, bs = self.rank, self.lens, self.block_size

        def readable(b, h, q_idx, kv_idx):  # slot kv_idx belongs to row b's context
            r = rank[b, kv_idx // bs]
            return (r >= 0) & (r * bs + kv_idx % bs < lens[b])

        self.mask_mod = readable

    def update(self, tables: torch.Tensor, used: torch.Tensor, lens: torch.Tensor) -> None:
        """Rows ``0 … B-1`` become this step's decodes (``tables`` [B, width] padded, ``used`` [B], ``lens`` [B])."""
        B = len(lens)
        if B > self.capacity:
            self._grow(max(B, 2 * self.capacity))
        self.rank[:B] = block_ranks(tables, used, self.num_blocks).to(self.device)
        self.lens[:B] = lens.to(self.device)


def paged_decodes(decodes, mask_state: DecodeMask) -> PagedDecodes:
    """``decodes``: (row, block_table, kv_len) per decode of the step -> rows and the block mask (see module)."""
    B, bs, device = len(decodes), mask_state.block_size, mask_state.device
    lens = torch.tensor([d[2] for d in decodes], dtype=torch.int32)
    used = torch.tensor([blocks_for_tokens(d[2], bs) for d in decodes], dtype=torch.int32)  # [B]
    width = int(used.max())
    tables = torch.zeros((B, width), dtype=torch.int32)
    for b, (_, table, _) in enumerate(decodes):
        tables[b, : int(used[b])] = torch.as_tensor(table[: int(used[b])], dtype=torch.int32)
    mask_state.update(tables, used, lens)
    partial = (lens % bs != 0).to(torch.int32)  # 1 when the last block is partly filled
    last = tables.gather(1, (used - 1).long()[:, None])  # [B, 1]
    mask = BlockMask.from_kv_blocks(
        partial.view(B, 1, 1).to(device), last.view(B, 1, 1, 1).to(device),
        (used - partial).view(B, 1, 1).to(device), tables.view(B, 1, 1, width).to(device),
        BLOCK_SIZE=(16, bs), mask_mod=mask_state.mask_mod, seq_lengths=(1, mask_state.num_blocks * bs),
        compute_q_blocks=False,
    )
    rows = torch.tensor([d[0] for d in decodes], dtype=torch.long, device=device)
    return PagedDecodes(rows, mask)


class FusedBackend:
    """Chunks in one call each (bottom-right causal after a prefix), decodes in one paged FlexAttention call."""

    name = "fused"
    uses_decode_groups = False

    def __init__(self):
        self._mask_state: DecodeMask | None = None

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None:
        if probe is not None:
            raise ValueError("the fused attention backend runs no probes: a probed layer uses the reference backend")
        if not isinstance(k_cache, torch.Tensor):
            raise ValueError("the fused attention backend reads the pool in place: it needs a pool in the model's "
                             "dtype, not a quantized or cast one (choose_backend with pool_in_model_dtype=False)")
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

    def _decodes(self, q, k_cache, v_cache, meta, out) -> None:
        paged = meta.scratch.get("paged_decodes")
        if paged is None:  # once per step, for every layer
            state = self._mask_state
            num_blocks = k_cache.shape[0] // meta.block_size
            if state is None or (state.num_blocks, state.block_size, state.device) != (
                    num_blocks, meta.block_size, q.device):
                state = self._mask_state = DecodeMask(num_blocks, meta.block_size, q.device)
            paged = meta.scratch["paged_decodes"] = paged_decodes(meta.decodes, state)
        qd = q[paged.rows].unsqueeze(2)  # [B, H, 1, d]
        keys = k_cache.permute(1, 0, 2).unsqueeze(0)  # [1, H_kv, num_slots, d], a view of the pool
        values = v_cache.permute(1, 0, 2).unsqueeze(0)
        if q.device.type == "cuda":
            o = _flex()(qd, keys, values, block_mask=paged.block_mask, enable_gqa=True)
        else:  # eager: the reference semantics, computed densely over the pool (tests, the curious)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_EAGER_WARNING)
                o = flex_attention(qd, keys, values, block_mask=paged.block_mask, enable_gqa=True)
        out[paged.rows] = o.squeeze(2)  # [B, H, d]
