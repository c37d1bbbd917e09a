"""Block manager: the bookkeeping of a paged KV cache (vLLM's PagedAttention, Kwon et al., SOSP 2023).

The pool holds ``num_blocks`` blocks of ``block_size`` token slots each. A sequence owns a *block table*:
the list of its block ids, in order. Token position ``p`` of a sequence lives in slot

    slot = block_table[p // block_size] * block_size + p % block_size

of the flattened pool (the *slot mapping*). Blocks are handed out on demand as a sequence grows and all
come back when it finishes or is preempted.

Check, then act: ``can_allocate`` only answers; ``allocate`` / ``append`` / ``free`` change state and raise
``ValueError`` when asked for the impossible. Pure Python: the scheduler uses it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def blocks_for_tokens(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``num_tokens`` token slots: ceil(num_tokens / block_size)."""
    return -(-num_tokens // block_size)


@dataclass
class BlockManager:
    """Hands out the blocks of a pool of ``num_blocks`` blocks of ``block_size`` tokens.

    Sequences are identified by an integer ``seq_id``. For each one the manager tracks its block table and
    ``num_tokens(seq_id)``, the number of token slots reserved so far.
    """

    num_blocks: int
    block_size: int = 16
    _free: list[int] = field(init=False, repr=False)
    _tables: dict[int, list[int]] = field(init=False, repr=False)
    _num_tokens: dict[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if int(self.num_blocks) != self.num_blocks or self.num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive integer, got {self.num_blocks!r}")
        if int(self.block_size) != self.block_size or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        # Pop from the end: block 0 is handed out first, which makes examples easy to read.
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._tables = {}
        self._num_tokens = {}

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

    def has(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def num_tokens(self, seq_id: int) -> int:
        """Token slots reserved for ``seq_id`` (0 for an unknown sequence)."""
        return self._num_tokens.get(seq_id, 0)

    def blocks_needed(self, seq_id: int, num_new_tokens: int) -> int:
        """Extra blocks ``seq_id`` needs to hold ``num_new_tokens`` more tokens (0 if its last block has room)."""
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        have = len(self._tables.get(seq_id, ()))
        need = -(-(self._num_tokens.get(seq_id, 0) + num_new_tokens) // self.block_size)  # ceil
        return max(0, need - have)

    def can_allocate(self, seq_id: int, num_new_tokens: int) -> bool:
        """Whether ``seq_id`` (new or not) can get slots for ``num_new_tokens`` more tokens right now."""
        return self.blocks_needed(seq_id, num_new_tokens) <= len(self._free)

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of the block ids of ``seq_id``, in token order."""
        return list(self._tables[seq_id])

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> list[int]:
        """Pool slot of each token position in ``[start, stop)`` of ``seq_id`` (all must be reserved)."""
        if not 0 <= start <= stop <= self.num_tokens(seq_id):
            raise ValueError(
                f"positions [{start}, {stop}) are outside the {self.num_tokens(seq_id)} slots reserved "
                f"for sequence {seq_id}"
            )
        table, bs = self._tables.get(seq_id, []), self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, stop)]

    # ---- actions ----
    def allocate(self, seq_id: int, num_new_tokens: int) -> list[int]:
        """Reserve slots for ``num_new_tokens`` more tokens of ``seq_id``; returns the new block ids.

        Creates the block table of a new sequence. Raises ``ValueError`` if the pool lacks blocks (ask
        ``can_allocate`` first); nothing changes then.
        """
        table = self._tables.get(seq_id)
        if (
            table is not None
            and 0 <= num_new_tokens
            and (self._num_tokens[seq_id] + num_new_tokens <= len(table) * self.block_size)
        ):  # fast path (most decode steps): the last block has room
            self._num_tokens[seq_id] += num_new_tokens
            return []
        need = self.blocks_needed(seq_id, num_new_tokens)
        if need > len(self._free):
            raise ValueError(
                f"sequence {seq_id} needs {need} more blocks for {num_new_tokens} tokens but only "
                f"{len(self._free)} of {self.num_blocks} are free"
            )
        new_blocks = [self._free.pop() for _ in range(need)]
        self._tables.setdefault(seq_id, []).extend(new_blocks)
        self._num_tokens[seq_id] = self.num_tokens(seq_id) + num_new_tokens
        return new_blocks

    def append(self, seq_id: int) -> list[int]:
        """Reserve one more slot for a decoding sequence (a new block only when its last block is full)."""
        if seq_id not in self._tables:
            raise ValueError(f"sequence {seq_id} has no blocks; allocate its prompt first")
        return self.allocate(seq_id, 1)

    def free(self, seq_id: int) -> int:
        """Return all blocks of ``seq_id`` to the pool; returns how many. Unknown ids free nothing."""
        table = self._tables.pop(seq_id, [])
        self._num_tokens.pop(seq_id, None)
        self._free.extend(reversed(table))
        return len(table)

    def check_invariants(self) -> None:
        """Raise AssertionError if a block is lost, shared or double-freed (used by tests)."""
        owned = [b for t in self._tables.values() for b in t]
        every = sorted(owned + self._free)
        assert every == list(range(self.num_blocks)), "blocks lost, shared or freed twice"
        for sid, table in self._tables.items():
            assert len(table) == blocks_for_tokens(self._num_tokens[sid], self.block_size), sid
