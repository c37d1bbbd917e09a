"""The paged KV cache tensors and the per-step attention metadata (torch).

For each layer the pool stores K and V as ``[num_blocks, block_size, num_kv_heads, head_dim]``; viewed flat,
``[num_slots, num_kv_heads, head_dim]`` with ``slot = block * block_size + offset`` (the block manager's
slot mapping). New keys/values are *written* at their slots; attention *gathers* a sequence's keys back
through its block table: K/V of a sequence need not be contiguous in memory (PagedAttention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class PagedKVCache:
    """K and V for every layer: ``k[layer]``, ``v[layer]`` are ``[num_blocks, block_size, H_kv, d_head]``."""

    def __init__(
        self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, device="cpu", dtype=torch.float32
    ):
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.data = torch.zeros(shape, device=device, dtype=dtype)

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int = 16, device="cpu", dtype=torch.float32):
        return cls(
            config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, device, dtype
        )

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``layer`` as ``[num_slots, H_kv, d_head]`` views."""
        k, v = self.data[layer]  # each [num_blocks, block_size, H_kv, d]
        return k.flatten(0, 1), v.flatten(0, 1)  # [num_blocks * block_size, H_kv, d]


@dataclass
class AttentionMetadata:
    """Where the tokens of one step go and which cached keys each of them sees.

    The step's tokens are concatenated: ``T = sum(num_new)`` rows. Sequence ``i`` owns rows
    ``[q_starts[i], q_starts[i] + q_lens[i])`` and attends to its ``kv_lens[i]`` keys (cached + new), at the
    pool slots ``kv_slots[i]``. Decodes (one new token) are grouped: ``decode_rows`` [B] and
    ``decode_kv_slots`` [B, L_max] padded with slot 0, ``decode_mask`` [B, L_max] True where a key is real.
    """

    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence
    q_starts: list[int]
    q_lens: list[int]
    kv_lens: list[int]
    kv_slots: list[torch.Tensor | None]  # [kv_len] per prefill chunk; None for grouped decodes
    decode_rows: torch.Tensor | None = None
    decode_kv_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None

    @property
    def prefill_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.kv_slots) if s is not None]


def _slots(block_table: list[int], block_size: int, start: int, stop: int) -> list[int]:
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def build_attention_metadata(chunks, block_size: int, device="cpu") -> AttentionMetadata:
    """``chunks``: ``(block_table, num_computed, num_new)`` per sequence of the step, in row order."""
    slot_mapping, positions, q_starts, q_lens, kv_lens, kv_slots = [], [], [], [], [], []
    decode_rows, decode_slots = [], []
    row = 0
    for table, num_computed, num_new in chunks:
        kv_len = num_computed + num_new
        slot_mapping += _slots(table, block_size, num_computed, kv_len)
        positions += range(num_computed, kv_len)
        q_starts.append(row)
        q_lens.append(num_new)
        kv_lens.append(kv_len)
        if num_new == 1:
            decode_rows.append(row)
            decode_slots.append(_slots(table, block_size, 0, kv_len))
            kv_slots.append(None)
        else:
            kv_slots.append(torch.tensor(_slots(table, block_size, 0, kv_len), device=device))
        row += num_new
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, device=device),
        positions=torch.tensor(positions, device=device),
        q_starts=q_starts,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_slots=kv_slots,
    )
    if decode_rows:
        max_len = max(len(s) for s in decode_slots)
        padded = [s + [0] * (max_len - len(s)) for s in decode_slots]
        mask = [[True] * len(s) + [False] * (max_len - len(s)) for s in decode_slots]
        meta.decode_rows = torch.tensor(decode_rows, device=device)
        meta.decode_kv_slots = torch.tensor(padded, device=device)  # [B, L_max]
        meta.decode_mask = torch.tensor(mask, device=device)  # [B, L_max]
    return meta
