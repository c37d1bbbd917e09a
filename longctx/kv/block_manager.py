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

Check, then act: ``can_allocate`` only answers; ``allocate`` / ``free`` change state and raise
``ValueError`` when asked for the impossible. Pure Python: the scheduler uses it without torch.
"""

from __future__ import annotations


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


def slots(block_table, positions, block_size: int):
    """Pool slot of token ``positions`` of a sequence with ``block_table``.

    Works on a Python list and an int position, or on a long tensor table and a tensor of positions
    (``longctx.kv.cache`` calls it that way): ``block_table[p // block_size] * block_size + p % block_size``.
    """
    return block_table[positions // block_size] * block_size + positions % block_size


class BlockManager:
    """Hands out the blocks of a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Sequences are identified by an integer ``seq_id``; the manager keeps one block table per sequence.
    """

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if isinstance(num_blocks, bool) or int(num_blocks) != num_blocks or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        # Pop from the end: block 0 is handed out first, which makes examples easy to read.
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._tables: dict[int, list[int]] = {}

    def __repr__(self) -> str:
        return (f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, "
                f"free={len(self._free)})")

    # ---- questions (no state change) ----
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def capacity_tokens(self) -> int:
        """Token slots in the whole pool."""
        return self.num_blocks * self.block_size

    def blocks_needed(self, seq_id: int, num_tokens: int) -> int:
        """Extra blocks ``seq_id`` needs to hold ``num_tokens`` tokens in total (0 if it has room)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        table = self._tables.get(seq_id)
        need = -(-num_tokens // self.block_size) - (len(table) if table else 0)
        return need if need > 0 else 0

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        """Whether ``seq_id`` (new or not) can hold ``num_tokens`` tokens in total right now."""
        return self.blocks_needed(seq_id, num_tokens) <= len(self._free)

    def block_table(self, seq_id: int) -> list[int]:
        """The block ids of ``seq_id`` in token order (the manager's own list: read it, don't change it).

        An unknown sequence has an empty table."""
        return self._tables.get(seq_id, [])

    # ---- actions ----
    def allocate(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow the table of ``seq_id`` to hold ``num_tokens`` tokens in total; returns the new block ids.

        Creates the table of a new sequence. Raises ``ValueError`` if the pool lacks blocks (ask
        ``can_allocate`` first); nothing changes then.
        """
        need = self.blocks_needed(seq_id, num_tokens)
        if need == 0:
            return []
        if need > len(self._free):
            raise ValueError(
                f"sequence {seq_id} needs {need} more blocks to hold {num_tokens} tokens but only "
                f"{len(self._free)} of {self.num_blocks} are free"
            )
        new_blocks = self._free[-need:][::-1]
        del self._free[-need:]
        self._tables.setdefault(seq_id, []).extend(new_blocks)
        return new_blocks

    def shrink(self, seq_id: int, num_tokens: int) -> int:
        """Keep only the blocks ``seq_id`` needs for its first ``num_tokens`` token slots; return the others
        to the pool (KV pruning compacts a sequence's kept tokens to the front). Returns how many."""
        if seq_id not in self._tables:
            raise ValueError(f"sequence {seq_id} holds no blocks")
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        table = self._tables[seq_id]
        keep = -(-num_tokens // self.block_size)
        tail = table[keep:]
        del table[keep:]
        self._free.extend(reversed(tail))
        return len(tail)

    def free(self, seq_id: int) -> int:
        """Return all blocks of ``seq_id`` to the pool; returns how many. Unknown ids free nothing."""
        table = self._tables.pop(seq_id, [])
        self._free.extend(reversed(table))
        return len(table)

    def check_invariants(self) -> None:
        """Raise AssertionError if a block is lost, shared or double-freed (used by tests)."""
        owned = [b for t in self._tables.values() for b in t]
        every = sorted(owned + self._free)
        assert every == list(range(self.num_blocks)), "blocks lost, shared or freed twice"
