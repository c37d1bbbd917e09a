"""The attention metadata of one engine step: which pool slots the step's tokens go to and which keys
each reads.

Built by ``build_attention_metadata`` from one :class:`ChunkSlots` per sequence (block table, tokens cached,
new tokens); read by the attention backends (``longctx.model.attention``). Plain tensors and lists: no model
code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from longctx.kv.block_manager import slots
from longctx.memory import blocks_for_tokens


@dataclass
class DecodeGroup:
    """Decodes attended together: ``rows`` of the step's tokens (a tensor [B], or a ``slice`` when they are
    consecutive), keys read by ``gather``. ``mask`` [B, L_max] is True where a key is real (None when
    every sequence of the group has ``L_max`` keys).

    Keys are read whole blocks at a time (``index_select`` over ``kv_blocks`` [B * blocks], much faster
    than a gather per slot), then cut to ``L_max``; a group of one sequence whose blocks are consecutive
    in the pool reads them as a ``slice`` of slots (a view, no copy).
    """

    rows: torch.Tensor | slice
    kv_blocks: torch.Tensor | slice
    block_size: int
    max_len: int
    mask: torch.Tensor | None

    def gather(self, cache_flat: torch.Tensor) -> torch.Tensor:
        """Keys (or values) of the group from a layer's flat cache ``[num_slots, H_kv, d]``
        -> [B, L_max, H_kv, d]."""
        if isinstance(self.kv_blocks, slice):
            return cache_flat[self.kv_blocks].unsqueeze(0)  # [1, L, H_kv, d], a view
        if not isinstance(cache_flat, torch.Tensor):  # an EncodedKV pool: decode the picked blocks only
            picked = cache_flat.select_blocks(self.kv_blocks, self.block_size)
        else:
            blocks = cache_flat.view(-1, self.block_size, *cache_flat.shape[1:])  # [num_blocks, bs, H_kv, d]
            picked = blocks.index_select(0, self.kv_blocks)  # [B * nb, bs, H_kv, d]
        return picked.view(len(self), -1, *picked.shape[2:])[:, : self.max_len]  # [B, L_max, H_kv, d]

    def __len__(self) -> int:
        rows = self.rows
        return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


@dataclass
class AttentionMetadata:
    """Where the tokens of one step go and which cached keys each of them sees.

    The step's tokens are concatenated: ``T = sum(q_lens)`` rows. Sequence ``i`` owns rows
    ``[q_starts[i], q_starts[i] + q_lens[i])`` and attends to its ``kv_lens[i]`` keys (cached + new). A
    prefill chunk reads them at ``kv_index[i]``: a ``slice`` of pool slots when its blocks are consecutive
    (a view, no copy), else a long tensor of slots (a gather); ``kv_index[i]`` is None for a decode.
    Decodes (one new token) are listed in ``decodes`` as (row, block table, kv_len) and, for the reference
    backend, batched in ``decode_groups`` of similar context length, so that padding stays small.
    ``scratch`` holds what a backend derives once per step and shares across layers. ``window``: the
    layers that read this metadata attend through a sliding window of that many tokens (None: to all).
    """

    slot_mapping: torch.Tensor  # [T] pool slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence
    q_starts: list[int]
    q_lens: list[int]
    kv_lens: list[int]
    kv_index: list[slice | torch.Tensor | None]
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    decodes: list[tuple[int, list[int], int]] = field(default_factory=list)
    block_size: int = 16
    scratch: dict = field(default_factory=dict)
    window: int | None = None

    def for_layer(self, layer: int) -> AttentionMetadata:
        """The metadata ``layer`` reads: this one, for every layer (a hybrid pool's step has one per
        KV-cache group: ``longctx.kv.hybrid.GroupedMetadata``)."""
        return self

    def groups(self) -> list[DecodeGroup]:
        """``decode_groups``, built on first use when the step was built without them."""
        if self.decodes and not self.decode_groups:
            self.decode_groups = _group_decodes(self.decodes, self.block_size, self.slot_mapping.device,
                                                self.window)
        return self.decode_groups

    @property
    def prefill_indices(self) -> list[int]:
        return [i for i, index in enumerate(self.kv_index) if index is not None]


def _slots(table: torch.Tensor, block_size: int, start: int, stop: int) -> torch.Tensor:
    """Pool slots of positions ``[start, stop)`` of a sequence with block table ``table`` (a long tensor)."""
    return slots(table, torch.arange(start, stop), block_size)  # [stop - start]


def _kv_index(table: list[int], block_size: int, kv_len: int, device):
    """Slots of positions ``[0, kv_len)``: a slice when the blocks are consecutive, else a tensor."""
    used = table[: blocks_for_tokens(kv_len, block_size)]
    first = used[0]
    if used[-1] - first == len(used) - 1 and used == list(range(first, first + len(used))):
        return slice(first * block_size, first * block_size + kv_len)
    return _slots(torch.as_tensor(used), block_size, 0, kv_len).to(device)


def _group_decodes(decodes, block_size, device, window: int | None = None) -> list[DecodeGroup]:
    """``decodes``: (row, block_table, kv_len). Sort by context length; a group grows while its longest
    context stays within 1.5x + 64 of its shortest, so padding wastes little. On a CPU, a sequence whose
    blocks are consecutive gets a group of its own, read in place (a slice: one attention call, no copy;
    copying its keys costs more than the call there). With a sliding ``window`` a decode sees only its
    last ``window`` keys: a slice starts there, a padded group masks the keys before it."""
    groups, current = [], []
    for d in sorted(decodes, key=lambda d: d[2]):
        if current and d[2] > 1.5 * current[0][2] + 64:
            groups.append(current)
            current = []
        current.append(d)
    if current:
        groups.append(current)
    if torch.device(device).type == "cpu":  # read consecutive sequences in place, one call each (no copy)
        split = []
        for g in groups:
            alone = [d for d in g if isinstance(_kv_index(d[1], block_size, d[2], "cpu"), slice)]
            split += [[d] for d in alone]
            rest = [d for d in g if not any(d is a for a in alone)]
            if rest:
                split.append(rest)
        groups = split
    out = []
    for g in groups:
        row_ids = [d[0] for d in g]
        if row_ids == list(range(row_ids[0], row_ids[0] + len(g))):
            rows = slice(row_ids[0], row_ids[0] + len(g))
        else:
            rows = torch.tensor(row_ids, device=device)
        lens = [d[2] for d in g]
        width = max(lens)
        lower = [0 if window is None else max(0, n - window) for n in lens]  # first key each one sees
        if len(g) == 1:
            index = _kv_index(g[0][1], block_size, width, device)
            if isinstance(index, slice):
                index = slice(index.start + lower[0], index.stop)
                out.append(DecodeGroup(rows, index, block_size, width - lower[0], None))
                continue
        nb = blocks_for_tokens(width, block_size)
        tables = [t[:nb] + [0] * (nb - min(nb, len(t))) for _, t, _ in g]  # padded with block 0 (masked)
        kv_blocks = torch.tensor(tables, dtype=torch.long).flatten().to(device)  # [B * nb]
        mask = None
        if min(lens) < width or max(lower) > 0:
            key = torch.arange(width)[None, :]
            mask = ((key < torch.tensor(lens)[:, None]) & (key >= torch.tensor(lower)[:, None])).to(device)
        out.append(DecodeGroup(rows, kv_blocks, block_size, width, mask))
    return out


class ChunkSlots(NamedTuple):
    """One sequence's new tokens in a step: cache slots ``num_cached …`` of ``block_table``, RoPE positions
    from ``first_position`` (None: ``num_cached``; ahead of it once KV pruning evicted entries). Plain tuples
    work too."""

    block_table: list[int]
    num_cached: int
    num_new: int
    first_position: int | None = None


def build_attention_metadata(
    chunks, block_size: int, device="cpu", decode_groups: bool = True, window: int | None = None
) -> AttentionMetadata:
    """``chunks``: one :class:`ChunkSlots` (or a tuple of its fields) per sequence of the step, in row order.
    ``decode_groups=False`` skips the padded decode groups (a backend that reads ``decodes`` directly);
    ``window``: the sliding window of the layers that read it (None: they attend to every key).

    Integer arithmetic for decodes, tensor ops per prefill chunk and per decode group: no Python loop
    per token, so it stays cheap for long prompts and large decode batches."""
    slot_parts, pos_parts, q_starts, q_lens, kv_lens, kv_index, decodes = [], [], [], [], [], [], []
    row = 0
    for chunk in chunks:
        table, num_cached, num_new, first = ChunkSlots(*chunk)
        first = num_cached if first is None else first
        kv_len = num_cached + num_new
        q_starts.append(row)
        q_lens.append(num_new)
        kv_lens.append(kv_len)
        if num_new == 1:
            slot_parts.append(slots(table, num_cached, block_size))
            pos_parts.append(first)
            decodes.append((row, table, kv_len))
            kv_index.append(None)
        else:
            t = torch.as_tensor(table, dtype=torch.long)
            slot_parts.append(_slots(t, block_size, num_cached, kv_len))
            pos_parts.append(torch.arange(first, first + num_new))
            kv_index.append(_kv_index(table, block_size, kv_len, device))
        row += num_new
    return AttentionMetadata(
        slot_mapping=_concat(slot_parts).to(device),
        positions=_concat(pos_parts).to(device),
        q_starts=q_starts,
        q_lens=q_lens,
        kv_lens=kv_lens,
        kv_index=kv_index,
        decode_groups=_group_decodes(decodes, block_size, device, window) if decode_groups else [],
        decodes=decodes,
        block_size=block_size,
        window=window,
    )


def _concat(parts: list) -> torch.Tensor:
    """One long tensor from ints and long tensors, in order (runs of ints become one tensor)."""
    out, ints = [], []
    for p in parts:
        if isinstance(p, int):
            ints.append(p)
            continue
        if ints:
            out.append(torch.tensor(ints))
            ints = []
        out.append(p)
    if ints:
        out.append(torch.tensor(ints))
    return out[0] if len(out) == 1 else torch.cat(out)
