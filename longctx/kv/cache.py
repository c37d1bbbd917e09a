"""The paged KV cache tensors and the per-step attention metadata (torch).

For each layer the pool stores K and V as ``[num_blocks, block_size, num_kv_heads, head_dim]``; viewed flat,
``[num_slots, num_kv_heads, head_dim]`` with ``slot = block * block_size + offset`` (the block manager's
slot mapping). New keys/values are *written* at their slots; attention *gathers* a sequence's keys back
through its block table: K/V of a sequence need not be contiguous in memory (PagedAttention).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
class DecodeGroup:
    """Decodes attended together: ``rows`` [B] of the step's tokens, keys at ``kv_slots`` [B, L_max] padded
    with slot 0 and ``mask`` [B, L_max] True where a key is real. A group of one sequence whose blocks are
    consecutive in the pool reads its keys as a ``slice`` of slots (no copy) and needs no mask."""

    rows: torch.Tensor
    kv_slots: torch.Tensor | slice
    mask: torch.Tensor | None


@dataclass
class AttentionMetadata:
    """Where the tokens of one step go and which cached keys each of them sees.

    The step's tokens are concatenated: ``T = sum(num_new)`` rows. Sequence ``i`` owns rows
    ``[q_starts[i], q_starts[i] + q_lens[i])`` and attends to its ``kv_lens[i]`` keys (cached + new), at the
    pool slots ``kv_slots[i]``; ``kv_ranges[i]`` is the same as a ``slice`` when its blocks are consecutive
    (read without a gather). Decodes (one new token) are batched in ``decode_groups`` of similar context
    length, so that padding stays small; ``decode_rows`` / ``decode_kv_slots`` / ``decode_mask`` describe
    all decodes as one padded group (the older form, still accepted when ``decode_groups`` is empty).
    """

    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence
    q_starts: list[int]
    q_lens: list[int]
    kv_lens: list[int]
    kv_slots: list[torch.Tensor | None]  # [kv_len] per prefill chunk; None for decodes
    kv_ranges: list[slice | None] = field(default_factory=list)  # per prefill chunk, when consecutive
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    decode_rows: torch.Tensor | None = None
    decode_kv_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None

    @property
    def prefill_indices(self) -> list[int]:
        return [i for i, s in enumerate(self.kv_slots) if s is not None]

    def groups(self) -> list[DecodeGroup]:
        """The decode groups (built from the older single-group fields if those are what is set)."""
        if self.decode_groups or self.decode_rows is None:
            return self.decode_groups
        return [DecodeGroup(self.decode_rows, self.decode_kv_slots, self.decode_mask)]


def _slots(table: torch.Tensor, block_size: int, start: int, stop: int) -> torch.Tensor:
    """Pool slots of positions ``[start, stop)`` of a sequence with block table ``table`` (a long tensor)."""
    pos = torch.arange(start, stop)
    return table[pos // block_size] * block_size + pos % block_size  # [stop - start]


def _kv_index(table: list[int], block_size: int, kv_len: int, device):
    """Slots of positions ``[0, kv_len)``: a slice when the blocks are consecutive, else a tensor."""
    used = table[: -(-kv_len // block_size)]
    if used[-1] - used[0] == len(used) - 1 and used == list(range(used[0], used[-1] + 1)):
        return slice(used[0] * block_size, used[0] * block_size + kv_len)
    return _slots(torch.as_tensor(used), block_size, 0, kv_len).to(device)


def _group_decodes(decodes, block_size, device) -> list[DecodeGroup]:
    """``decodes``: (row, block_table, kv_len). Sort by context length; a group grows while its longest
    context stays within 1.5x + 64 of its shortest, so padding wastes little."""
    groups, current = [], []
    for d in sorted(decodes, key=lambda d: d[2]):
        if current and d[2] > 1.5 * current[0][2] + 64:
            groups.append(current)
            current = []
        current.append(d)
    if current:
        groups.append(current)
    out = []
    for g in groups:
        rows = torch.tensor([d[0] for d in g], device=device)
        if len(g) == 1:
            out.append(DecodeGroup(rows, _kv_index(g[0][1], block_size, g[0][2], device), None))
            continue
        lens = torch.tensor([d[2] for d in g])
        padded = torch.zeros(len(g), int(lens.max()), dtype=torch.long)  # [B, L_max], padded with slot 0
        for i, (_, table, n) in enumerate(g):
            padded[i, :n] = _slots(torch.as_tensor(table), block_size, 0, n)
        mask = torch.arange(padded.shape[1])[None, :] < lens[:, None]  # [B, L_max]
        out.append(DecodeGroup(rows, padded.to(device), mask.to(device)))
    return out


def build_attention_metadata(chunks, block_size: int, device="cpu") -> AttentionMetadata:
    """``chunks``: ``(block_table, num_computed, num_new)`` per sequence of the step, in row order.

    Tensor ops per sequence, no Python loop per token: cheap even for 32K-token decode batches."""
    slot_parts, pos_parts, q_starts, q_lens, kv_lens, kv_slots, decodes = [], [], [], [], [], [], []
    kv_ranges = []
    row = 0
    for table, num_computed, num_new in chunks:
        kv_len = num_computed + num_new
        slot_parts.append(_slots(torch.as_tensor(table, dtype=torch.long), block_size, num_computed, kv_len))
        pos_parts.append(torch.arange(num_computed, kv_len))
        q_starts.append(row)
        q_lens.append(num_new)
        kv_lens.append(kv_len)
        if num_new == 1:
            decodes.append((row, list(table), kv_len))
            kv_slots.append(None)
            kv_ranges.append(None)
        else:
            t = torch.as_tensor(table, dtype=torch.long)
            kv_slots.append(_slots(t, block_size, 0, kv_len).to(device))
            index = _kv_index(list(table), block_size, kv_len, device)
            kv_ranges.append(index if isinstance(index, slice) else None)
        row += num_new
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slot_parts).to(device),
        positions=torch.cat(pos_parts).to(device),
        q_starts=q_starts,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_slots=kv_slots,
        kv_ranges=kv_ranges,
        decode_groups=_group_decodes(decodes, block_size, device),
    )
    if decodes:  # the older one-group form too (cheap: integers only)
        lens = torch.tensor([n for _, _, n in decodes])
        padded = torch.zeros(len(decodes), int(lens.max()), dtype=torch.long)  # [B, L_max]
        for i, (_, table, n) in enumerate(decodes):
            padded[i, :n] = _slots(torch.as_tensor(table), block_size, 0, n)
        meta.decode_rows = torch.tensor([r for r, _, _ in decodes], device=device)
        meta.decode_kv_slots = padded.to(device)
        meta.decode_mask = (torch.arange(padded.shape[1])[None, :] < lens[:, None]).to(device)
    return meta
