"""Checks a request passes before the engine takes it (``Engine.add_request``; the server asks the same).

Each raises ``ValueError`` saying what is wrong and what is allowed. ``check_fits_pool`` is the one place the
KV pool's capacity is checked: a request whose prompt + ``max_tokens`` cannot fit in the *whole* pool would
wait (or be preempted) forever, so it is refused at once, by the engine and by the HTTP server alike.
"""

from __future__ import annotations

from longctx.checks import positive_int
from longctx.kv.block_manager import BlockManager, blocks_for_tokens


class PoolTooSmall(ValueError):
    """The request needs ``num_blocks_needed`` KV blocks; the whole pool has ``num_blocks``."""

    def __init__(self, message: str, num_blocks_needed: int, num_blocks: int) -> None:
        super().__init__(message)
        self.num_blocks_needed, self.num_blocks = num_blocks_needed, num_blocks


def check_fits_pool(block_manager: BlockManager, num_prompt_tokens: int, max_tokens: int) -> None:
    """Raise ``PoolTooSmall`` when ``num_prompt_tokens + max_tokens`` slots need more blocks than the pool has
    (``ceil((prompt + max_tokens) / block_size) > num_blocks``; a press or a prefix hit may need fewer, but a
    prompt is held whole while it is prefilled)."""
    bm = block_manager
    need = blocks_for_tokens(num_prompt_tokens + max_tokens, bm.block_size)
    if need > bm.num_blocks:
        raise PoolTooSmall(
            f"the request needs {need} KV cache blocks of {bm.block_size} tokens "
            f"({num_prompt_tokens} prompt + "
            f"{max_tokens} output tokens) but the pool has only {bm.num_blocks}",
            need,
            bm.num_blocks,
        )


def check_prompt_ids(prompt_token_ids, max_model_len: int, vocab_size: int | None) -> list[int]:
    """The prompt as a list of ints; refuses an empty prompt, one over ``max_model_len`` tokens, and token ids
    outside ``[0, vocab_size)`` (when ``vocab_size`` is given)."""
    ids = prompt_token_ids.tolist() if hasattr(prompt_token_ids, "tolist") else list(prompt_token_ids)
    if not ids:
        raise ValueError("the prompt is empty: give at least one token")
    if len(ids) > max_model_len:
        raise ValueError(f"the prompt has {len(ids)} tokens, more than max_model_len={max_model_len}")
    if vocab_size is not None:
        if not set(map(type, ids)) <= {int}:
            ids = [int(t) for t in ids]
        if not 0 <= min(ids) <= max(ids) < vocab_size:
            bad = next(t for t in ids if not 0 <= t < vocab_size)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    return ids


def check_max_tokens(max_tokens) -> int:
    """``max_tokens`` as an int >= 1 (an integral float is accepted; a bool is not)."""
    return positive_int("max_tokens", max_tokens)
