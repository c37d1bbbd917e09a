"""The KV cache of a hybrid model (sliding-window layers beside global ones), kept as vLLM's hybrid KV-cache
manager keeps it (vLLM ``v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``).

A global layer needs every earlier token's K and V; a sliding layer with window ``w`` only the last ``w``
tokens'. Gemma 3 270M has 3 global layers and 15 sliding ones (window 512): at 32K tokens a sliding layer
needs 1/64 of a global layer's cache, so holding both alike wastes most of the pool.

**Groups.** The layers are split into KV-cache groups of equal size, each group all of one kind
(``kv_cache_groups``: ``gcd`` of the two counts; Gemma 3 270M: one global group {5, 11, 17} and five sliding
groups of three). A block of the pool holds ``block_size`` tokens of K and V for the layers of ONE group
(the pool tensor is ``[group_size, 2, num_blocks, block_size, H_kv, d]``), so every block is the same size
and one free list serves all groups; each sequence has one block table per group.

**Sliding groups give blocks back.** Before a step computes a sequence's tokens from position ``p`` on, its
queries need no key older than ``p - w + 1``: ``release_out_of_window`` returns the sliding groups' blocks
that lie wholly before it (vLLM: ``remove_skipped_blocks``). A sliding table is ``offset`` dropped blocks
followed by the held ones; while a chunk of ``n`` tokens is computed it holds at most
``ceil((w - 1 + n) / block_size) + 1`` blocks (``sliding_blocks_bound``), whatever the prompt's length.

**Each group its own step metadata** (``GroupedMetadata``): slots from its own table, keys counted from its
first held block (a sliding layer's key ``j`` is position ``offset * block_size + j``; RoPE positions stay
absolute), and its ``window`` for the attention mask. A model reads ``meta.for_layer(i)``.

Not supported here, each refused in one line: prefix caching (a sliding block's content depends on the
window, so vLLM's hash chain needs extra rules), KV presses (they compact a sequence's blocks), restoring
another pool's tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from longctx.checks import positive_int
from longctx.kv.block_manager import BlockManager
from longctx.memory import blocks_for_tokens, sliding_blocks_bound
from longctx.specs import ModelSpec


@dataclass(frozen=True)
class KVGroup:
    """Layers that share block tables: ``window`` None for global layers, else their sliding window."""

    layers: tuple[int, ...]
    window: int | None


def kv_cache_groups(spec: ModelSpec) -> list[KVGroup]:
    """The KV-cache groups of ``spec``: one group of every layer for a full-attention model; else groups of
    ``gcd(#global, #sliding)`` layers, global first, each of one kind (layers in order)."""
    if not spec.is_hybrid:
        return [KVGroup(tuple(range(spec.num_layers)), None)]
    sliding = [i for i in range(spec.num_layers) if spec.is_sliding_layer(i)]
    full = [i for i in range(spec.num_layers) if not spec.is_sliding_layer(i)]
    size = math.gcd(len(full), len(sliding)) or max(len(full), len(sliding))
    groups = [KVGroup(tuple(full[i : i + size]), None) for i in range(0, len(full), size)]
    # sliding layers dealt round-robin so that group g holds layers g, g + k, ... like the global group
    per = len(sliding) // size
    groups += [KVGroup(tuple(sliding[g::per]), spec.sliding_window) for g in range(per)]
    return groups


__all__ = ["GroupedMetadata", "HybridBlockManager", "KVGroup", "block_manager_for", "build_grouped_metadata",
           "kv_cache_groups", "layer_metadata", "pool_blocks_for_tokens"]


def block_manager_for(spec: ModelSpec, num_blocks: int, block_size: int = 16,
                      enable_prefix_caching: bool = False):
    """The pool bookkeeping ``spec`` needs: a ``BlockManager`` for a full-attention model, a
    ``HybridBlockManager`` over ``kv_cache_groups(spec)`` for a hybrid one (prefix caching refused)."""
    if not spec.is_hybrid:
        return BlockManager(num_blocks, block_size, enable_prefix_caching)
    if enable_prefix_caching:
        raise ValueError(f"prefix caching is not supported for {spec.name} (sliding-window layers): a "
                         "sliding block's keys depend on the window; run without prefix caching")
    return HybridBlockManager(num_blocks, block_size, kv_cache_groups(spec))


def pool_blocks_for_tokens(spec: ModelSpec, num_tokens: int, block_size: int = 16) -> int:
    """Blocks that hold ``num_tokens`` tokens in every KV-cache group at once (no sliding block given
    back): enough for any schedule of a ``num_tokens`` sequence."""
    return blocks_for_tokens(num_tokens, block_size) * len(kv_cache_groups(spec))


class _Table:
    """One group's block table of one sequence: ``offset`` blocks given back, then ``held``."""

    __slots__ = ("held", "offset")

    def __init__(self) -> None:
        self.offset, self.held = 0, []

    @property
    def covered_blocks(self) -> int:
        return self.offset + len(self.held)


class HybridBlockManager:
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens shared by the KV-cache ``groups``.

    The engine asks it what it asks ``longctx.kv.block_manager.BlockManager`` (check, then act); a token
    count ``n`` means what it means there, the slots a sequence holds in total, and each group's table covers
    ``ceil(n / block_size)`` blocks of which a sliding group may have given its oldest back.
    """

    enable_prefix_caching = False
    num_evictions = 0
    num_cached_blocks = 0

    def __init__(self, num_blocks: int, block_size: int, groups: list[KVGroup]) -> None:
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        if not groups or len({len(g.layers) for g in groups}) != 1:
            raise ValueError("HybridBlockManager needs KV-cache groups of one size (kv_cache_groups)")
        self.groups = list(groups)
        where = {layer: (g, j) for g, group in enumerate(self.groups) for j, layer in enumerate(group.layers)}
        self._group_of_layer = [where[i][0] for i in range(len(where))]
        self._layer_slot = [where[i][1] for i in range(len(where))]
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._tables: dict[int, list[_Table]] = {}

    def __repr__(self) -> str:
        return (f"HybridBlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"groups={len(self.groups)}, free={self.num_free_blocks})")

    # ---- questions ----
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Token slots of the whole pool in one group's terms (a token of a full-attention pool needs a slot
        in every group)."""
        return self.num_blocks * self.block_size // len(self.groups)

    def group_of_layer(self) -> list[int]:
        """``[num_layers]``: the group each layer reads (fixed by the groups: computed once)."""
        return self._group_of_layer

    def layer_slot(self) -> list[int]:
        """``[num_layers]``: each layer's index inside its group (its place on the pool's layer axis)."""
        return self._layer_slot

    def tables(self, seq_id: int) -> list[tuple[int, list[int]]]:
        """Per group, ``(offset, held blocks)`` of ``seq_id`` (the manager's own lists: read only)."""
        return [(t.offset, t.held) for t in self._tables.get(seq_id, ())]

    def block_table(self, seq_id: int) -> list[int]:
        """The first (global) group's table: what a full-attention view of the sequence shows."""
        tables = self._tables.get(seq_id)
        return tables[0].held if tables else []

    def blocks_held(self, seq_id: int) -> list[int]:
        """Blocks ``seq_id`` holds in each group."""
        return [len(t.held) for t in self._tables.get(seq_id, ())]

    def extra_blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        need_each = blocks_for_tokens(num_tokens, self.block_size)
        tables = self._tables.get(seq_id)
        if tables is None:
            return need_each * len(self.groups)
        return sum(max(0, need_each - t.covered_blocks) for t in tables)

    def has_room(self, seq_id: int, num_tokens: int) -> bool:
        tables = self._tables.get(seq_id)
        return tables is not None and num_tokens <= tables[0].covered_blocks * self.block_size

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        return self.extra_blocks_needed(seq_id, num_tokens) <= self.num_free_blocks

    def cached_prefix(self, token_ids) -> None:
        return None

    def can_admit(self, seq_id: int, num_tokens: int, hit=None, num_new: int | None = None) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits while its prompt is computed ``num_new``
        tokens a step (None: all at once): its global groups hold all of it, its sliding groups at most
        ``sliding_blocks_bound`` blocks each."""
        if hit is not None:
            raise ValueError("prefix caching is not supported on a hybrid (sliding-window) KV cache")
        full = blocks_for_tokens(num_tokens, self.block_size)
        chunk = num_tokens if num_new is None else num_new
        need = sum(full if g.window is None else min(full, sliding_blocks_bound(g.window, self.block_size,
                                                                                   chunk))
                   for g in self.groups)
        return need <= self.num_free_blocks

    # ---- actions ----
    def release_out_of_window(self, seq_id: int, first_position: int) -> int:
        """Give back the sliding groups' blocks that no query from ``first_position`` on can see (every
        position ``<= first_position - window``). Returns how many blocks went back."""
        gone = 0
        for group, table in zip(self.groups, self._tables.get(seq_id, ()), strict=False):
            if group.window is None:
                continue
            first_needed = max(0, first_position - group.window + 1) // self.block_size
            drop = min(len(table.held), first_needed - table.offset)
            if drop > 0:
                self._free.extend(reversed(table.held[:drop]))
                del table.held[:drop]
                table.offset += drop
                gone += drop
        return gone

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow every group's table of ``seq_id`` to cover ``num_tokens`` tokens; returns the new blocks."""
        need = self.extra_blocks_needed(seq_id, num_tokens)
        if need > self.num_free_blocks:
            raise ValueError(f"sequence {seq_id} needs {need} more blocks to hold {num_tokens} tokens but "
                             f"only {self.num_free_blocks} of {self.num_blocks} are free")
        tables = self._tables.setdefault(seq_id, [_Table() for _ in self.groups])
        each, new = blocks_for_tokens(num_tokens, self.block_size), []
        for table in tables:
            for _ in range(each - table.covered_blocks):
                b = self._free.pop()
                table.held.append(b)
                new.append(b)
        return new

    def free(self, seq_id: int) -> int:
        tables = self._tables.pop(seq_id, [])
        n = 0
        for table in tables:
            self._free.extend(reversed(table.held))
            n += len(table.held)
        return n

    def take_prefix(self, seq_id, hit) -> None:
        raise ValueError("prefix caching is not supported on a hybrid (sliding-window) KV cache")

    def cache_full_blocks(self, seq_id, token_ids, num_tokens) -> None:
        return None

    def shrink(self, seq_id, num_tokens) -> int:
        raise ValueError("KV pruning (a press) is not supported on a hybrid (sliding-window) KV cache")

    def restore(self, tables, num_free_blocks=None) -> None:
        raise ValueError("restore is not supported on a hybrid (sliding-window) KV cache")

    def check_invariants(self) -> None:
        """AssertionError if a block is lost, held twice or both held and free (used by tests)."""
        held = [b for tables in self._tables.values() for t in tables for b in t.held]
        assert len(set(held)) == len(held), "a block is held twice"
        assert len(set(self._free)) == len(self._free), "a block is freed twice"
        assert sorted(held + self._free) == list(range(self.num_blocks)), "blocks lost, or held and free"
        for tables in self._tables.values():
            spans = {t.covered_blocks for t in tables}
            assert len(spans) == 1, "the groups of one sequence cover different spans"
            for group, t in zip(self.groups, tables, strict=True):
                assert group.window is not None or t.offset == 0, "a global group gave a block back"


def build_grouped_metadata(manager: HybridBlockManager, entries, device="cpu", decode_groups: bool = True):
    """The step's ``GroupedMetadata``: ``entries`` are ``(seq_id, num_cached, num_new, first_position)`` per
    sequence in row order; each group's slots come from its own table, counted from its first held block."""
    from longctx.kv.step_metadata import ChunkSlots, build_attention_metadata

    bs, metas = manager.block_size, []
    for g, group in enumerate(manager.groups):
        chunks = []
        for seq_id, num_cached, num_new, first in entries:
            offset, held = manager.tables(seq_id)[g]
            chunks.append(ChunkSlots(held, num_cached - offset * bs, num_new, first_position=first))
        metas.append(build_attention_metadata(chunks, bs, device, decode_groups, window=group.window))
    return GroupedMetadata(metas, manager.group_of_layer())


def layer_metadata(spec: ModelSpec, chunks, block_size: int, device="cpu", decode_groups: bool = True):
    """Step metadata over ONE block table per sequence shared by every layer (a pool with an entry per
    layer that gives nothing back, as the evals' contiguous caches are): one ``AttentionMetadata`` for a
    full-attention model; for a hybrid one, the same slots read with and without the sliding window."""
    from longctx.kv.step_metadata import build_attention_metadata

    full = build_attention_metadata(chunks, block_size, device, decode_groups)
    if not spec.is_hybrid:
        return full
    sliding = build_attention_metadata(chunks, block_size, device, decode_groups, window=spec.sliding_window)
    return GroupedMetadata([full, sliding], [int(spec.is_sliding_layer(i)) for i in range(spec.num_layers)])


class GroupedMetadata:
    """A hybrid step's attention metadata: one ``AttentionMetadata`` per KV-cache group; layer ``i`` reads
    ``for_layer(i)``."""

    def __init__(self, metas: list, group_of_layer: list[int]) -> None:
        self.metas, self.group_of_layer = metas, group_of_layer

    def for_layer(self, layer: int):
        return self.metas[self.group_of_layer[layer]]

    @property
    def positions(self):
        return self.metas[0].positions
