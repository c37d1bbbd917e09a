"""Block manager: the bookkeeping of a paged KV cache (vLLM's PagedAttention, Kwon et al., SOSP 2023).

The pool holds ``num_blocks`` blocks of ``block_size`` token slots each. It is described once, by the
``BlockManager``: the executor's cache tensors are built from the same object
(``PagedKVCache.for_pool``), so the two cannot disagree. A sequence owns a *block table*, the list of
its block ids in order. Token position ``p`` of a sequence lives in slot

    slot = block_table[p // block_size] * block_size + p % block_size

of the flattened pool (``slots``, the one place this formula is written; the cache uses it on tensors).
Blocks are handed out on demand as a sequence grows and all come back when it finishes or is preempted.

The manager knows block tables only. How many tokens a sequence holds is the sequence's own business
(``Sequence.num_computed_tokens``): callers say how many token slots a sequence needs *in total*, and the
manager grows its table to ``ceil(num_tokens / block_size)`` blocks.

Prefix caching (``enable_prefix_caching=True``; vLLM's automatic prefix caching): once a block is full,
it is identified by a hash chained over its tokens and its parent block's hash (``block_hash``), so two
sequences that start with the same tokens name the same blocks. A new sequence whose first full blocks are
cached takes those blocks (``cached_prefix``, ``take_prefix``) instead of computing them: each block has a
reference count, and a block is written only while it is being filled (new tokens go after the shared
ones). ``cache_full_blocks`` registers a block as soon as the tokens scheduled for it fill it, before the
step computes it (``ScheduledBatch.add`` calls it): a sequence scheduled later in the same step already
hits it, as in vLLM, which caches full blocks when it allocates them.

Eviction order, beside vLLM's. vLLM keeps every free block, cached or blank, in one LRU free queue:
allocation takes the head (evicting its hash if it has one), and a finished request's blocks are appended
tail block first, so a request's last blocks, the least likely to be shared, are evicted before its first.
Ours frees in the same order (``_release``: tail first; cached blocks go to the end of an LRU list), but
keeps two lists: blank blocks (never cached, or evicted) are handed out first, and a cached block is
evicted only when no blank block is left, the least recently freed first (``_take``). So while the pool has
blank blocks we keep every cached prefix, where vLLM may already evict the oldest one; once the pool is
full of cached blocks, both evict in the same order.

Check, then act: ``can_allocate`` only answers; ``allocate`` / ``free`` change state and raise
``ValueError`` when asked for the impossible. Pure Python: the scheduler uses it without torch.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import NamedTuple

from longctx.checks import positive_int
from longctx.memory import blocks_for_tokens  # ceil(num_tokens / block_size); importers find it here too


def slots(block_table, positions, block_size: int):
    """Pool slot of token ``positions`` of a sequence with ``block_table``.

    Works on a Python list and an int position, or on a long tensor table and a tensor of positions
    (``longctx.kv.cache`` calls it that way): ``block_table[p // block_size] * block_size + p % block_size``.
    """
    return block_table[positions // block_size] * block_size + positions % block_size


def block_hash(parent: bytes | None, token_ids) -> bytes:
    """Identity of a full block: SHA-256 of its parent's hash and its token ids (the chain makes a block's
    hash depend on every token before it, so equal hashes mean equal prefixes)."""
    return hashlib.sha256((parent or b"") + array("q", token_ids).tobytes()).digest()


class PrefixHit(NamedTuple):
    """Cached blocks that hold the first ``len(blocks) * block_size`` tokens of a sequence."""

    blocks: list[int]
    hashes: list[bytes]
    num_tokens: int


class BlockManager:
    """Hands out the blocks of a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Sequences are identified by an integer ``seq_id``; the manager keeps one block table per sequence.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = False) -> None:
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        # Pop from the end: block 0 is handed out first, which makes examples easy to read.
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._ref = [0] * self.num_blocks  # sequences whose table holds the block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free, holding a cached block; LRU first
        self._hash_of: dict[int, bytes] = {}  # block -> hash of its (full) content
        self._block_of: dict[bytes, int] = {}  # hash -> block: the prefix cache
        self._chains: dict[int, list[bytes]] = {}  # seq_id -> hashes of its full blocks so far
        self.num_evictions = 0

    def __repr__(self) -> str:
        cached = f", cached={len(self._block_of)}" if self.enable_prefix_caching else ""
        return (f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={self.num_free_blocks}{cached})")

    # ---- questions (no state change) ----
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds: blank ones and cached ones that may be evicted."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Full blocks the prefix cache can hand out (held or evictable)."""
        return len(self._block_of)

    def ref_count(self, block: int) -> int:
        """How many sequences hold ``block`` (a block with a count above 1 is shared: never written)."""
        return self._ref[block]

    @property
    def capacity_tokens(self) -> int:
        """Token slots in the whole pool."""
        return self.num_blocks * self.block_size

    def extra_blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """Blocks ``seq_id`` needs beyond those it holds to hold ``num_tokens`` tokens in total (0 if it has
        room)."""
        table = self._tables.get(seq_id)
        need = blocks_for_tokens(num_tokens, self.block_size) - (len(table) if table else 0)
        return need if need > 0 else 0

    def has_room(self, seq_id: int, num_tokens: int) -> bool:
        """Whether the blocks ``seq_id`` holds already have slots for ``num_tokens`` tokens in total (a
        decode's usual case: no block to take; ``extra_blocks_needed == 0`` without counting)."""
        table = self._tables.get(seq_id)
        return table is not None and num_tokens <= len(table) * self.block_size

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        """Whether ``seq_id`` (new or not) can hold ``num_tokens`` tokens in total right now."""
        return self.extra_blocks_needed(seq_id, num_tokens) <= self.num_free_blocks

    def cached_prefix(self, token_ids: list[int]) -> PrefixHit | None:
        """The longest run of cached full blocks at the start of ``token_ids``, or None (a question: nothing
        changes). At most ``len - 1`` tokens are a hit: the last token is always computed, to give the next
        token's logits."""
        if not self.enable_prefix_caching or not self._block_of:
            return None
        blocks, hashes, parent, bs = [], [], None, self.block_size
        for i in range((len(token_ids) - 1) // bs):
            h = block_hash(parent, token_ids[i * bs : (i + 1) * bs])
            b = self._block_of.get(h)
            if b is None:
                break
            blocks.append(b)
            hashes.append(h)
            parent = h
        return PrefixHit(blocks, hashes, len(blocks) * bs) if blocks else None

    def can_admit(self, seq_id: int, num_tokens: int, hit: PrefixHit | None = None,
                  num_new: int | None = None) -> bool:
        """Whether a sequence holding no blocks can hold ``num_tokens`` tokens, taking ``hit``'s blocks
        (``num_new``, the tokens of its first step, matters only to a hybrid pool: ``longctx.kv.hybrid``)."""
        if hit is None:
            return self.can_allocate(seq_id, num_tokens)
        new = blocks_for_tokens(num_tokens, self.block_size) - len(hit.blocks)
        idle = sum(1 for b in hit.blocks if self._ref[b] == 0)  # cached, but counted as free now
        return new <= self.num_free_blocks - idle

    def block_table(self, seq_id: int) -> list[int]:
        """The block ids of ``seq_id`` in token order (the manager's own list: read it, don't change it).

        An unknown sequence has an empty table."""
        return self._tables.get(seq_id, [])

    # ---- actions ----
    def take_prefix(self, seq_id: int, hit: PrefixHit) -> None:
        """Start the table of ``seq_id`` (holding no blocks) with the cached blocks of ``hit``."""
        if self._tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} already holds blocks: a prefix hit starts a new table")
        for b in hit.blocks:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
        self._tables[seq_id] = list(hit.blocks)
        self._chains[seq_id] = list(hit.hashes)

    def cache_full_blocks(self, seq_id: int, token_ids, num_tokens: int) -> None:
        """Hash the blocks of ``seq_id`` that its first ``num_tokens`` computed tokens fill, so later
        sequences can share them. ``token_ids(start, stop)`` gives the ids (``Sequence.token_ids``)."""
        if not self.enable_prefix_caching:
            return
        chain, bs = self._chains.setdefault(seq_id, []), self.block_size
        table = self._tables.get(seq_id, [])
        while (len(chain) + 1) * bs <= num_tokens and len(chain) < len(table):
            i = len(chain)
            h = block_hash(chain[-1] if chain else None, token_ids(i * bs, (i + 1) * bs))
            chain.append(h)
            b = table[i]
            if b not in self._hash_of and h not in self._block_of:  # a duplicate computed twice stays private
                self._hash_of[b] = h
                self._block_of[h] = b

    def _take(self, n: int) -> list[int]:
        """``n`` free blocks: blank ones first, then the least recently freed cached ones (evicted)."""
        blank = min(n, len(self._free))
        taken = self._free[len(self._free) - blank:][::-1]
        del self._free[len(self._free) - blank:]
        for _ in range(n - blank):
            b, _ = self._evictable.popitem(last=False)
            del self._block_of[self._hash_of.pop(b)]
            self.num_evictions += 1
            taken.append(b)
        ref = self._ref
        for b in taken:
            ref[b] = 1
        return taken

    def _release(self, blocks) -> None:
        """Drop one reference to each of ``blocks`` (tail first): blank ones return to the free stack,
        cached ones to the end of the LRU list."""
        ref, hashed, free = self._ref, self._hash_of, self._free  # (locals: a sequence frees all its blocks)
        for b in reversed(blocks):
            ref[b] -= 1
            if ref[b] == 0:
                if b in hashed:
                    self._evictable[b] = None
                else:
                    free.append(b)

    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow the table of ``seq_id`` to hold ``num_tokens`` tokens in total; returns the new block ids.

        Creates the table of a new sequence. Raises ``ValueError`` if the pool lacks blocks (ask
        ``can_allocate`` first); nothing changes then.
        """
        need = self.extra_blocks_needed(seq_id, num_tokens)
        if need == 0:
            return []
        if need > self.num_free_blocks:
            raise ValueError(
                f"sequence {seq_id} needs {need} more blocks to hold {num_tokens} tokens but only "
                f"{self.num_free_blocks} of {self.num_blocks} are free"
            )
        new_blocks = self._take(need)
        self._tables.setdefault(seq_id, []).extend(new_blocks)
        return new_blocks

    def release_out_of_window(self, seq_id: int, first_position: int) -> int:
        """Blocks no query from ``first_position`` on can see, given back: none here, every layer attends to
        every earlier token (a hybrid pool's sliding groups do give some back: ``longctx.kv.hybrid``)."""
        return 0

    def shrink(self, seq_id: int, num_tokens: int) -> int:
        """Keep only the blocks ``seq_id`` needs for its first ``num_tokens`` token slots; return the others
        to the pool (KV pruning compacts a sequence's kept tokens to the front). Returns how many."""
        if seq_id not in self._tables:
            raise ValueError(f"sequence {seq_id} holds no blocks")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if self.enable_prefix_caching:
            raise ValueError(
                "shrink rewrites a sequence's blocks (KV pruning); it cannot be used with prefix caching"
            )
        table = self._tables[seq_id]
        keep = blocks_for_tokens(num_tokens, self.block_size)
        tail = table[keep:]
        del table[keep:]
        self._release(tail)
        return len(tail)

    def free(self, seq_id: int) -> int:
        """Return all blocks of ``seq_id`` to the pool; returns how many. Unknown ids free nothing."""
        table = self._tables.pop(seq_id, [])
        self._chains.pop(seq_id, None)
        self._release(table)
        return len(table)

    def restore(self, tables: dict[int, list[int]], num_free_blocks: int | None = None) -> None:
        """Make this unused manager hold ``tables`` (seq id -> its block ids: another pool's state), with
        ``num_free_blocks`` of the other blocks free (default: all; the rest are held outside these
        tables)."""
        if self._tables or len(self._free) != self.num_blocks:
            raise ValueError("restore needs a manager that holds nothing yet")
        for sid, table in tables.items():
            if table:
                self._tables[sid] = list(table)
                for b in table:
                    self._ref[b] += 1
        unused = [b for b in range(self.num_blocks - 1, -1, -1) if self._ref[b] == 0]
        self._free = unused if num_free_blocks is None else unused[:num_free_blocks]

    def check_invariants(self) -> None:
        """Raise AssertionError if a block is lost, shared without prefix caching, or freed twice, or if
        the reference counts and the prefix cache disagree with the tables (used by tests)."""
        held = {b for t in self._tables.values() for b in t}
        counts = [0] * self.num_blocks
        for t in self._tables.values():
            assert len(set(t)) == len(t), "a block appears twice in one table"
            for b in t:
                counts[b] += 1
        assert counts == self._ref, "reference counts differ from the tables"
        assert min(self._ref, default=0) >= 0, "a negative reference count"
        if not self.enable_prefix_caching:
            assert max(self._ref, default=0) <= 1, "a block is shared without prefix caching"
        free = list(self._free) + list(self._evictable)
        assert len(set(free)) == len(free), "a block is freed twice"
        assert sorted(list(held) + free) == list(range(self.num_blocks)), "blocks lost, or held and free"
        assert all(b not in self._hash_of for b in self._free), "a blank free block has a hash"
        assert all(b in self._hash_of for b in self._evictable), "an evictable block has no hash"
        assert {h: b for b, h in self._hash_of.items()} == self._block_of, "the prefix cache is inconsistent"
