"""Teacher forcing over a (possibly pruned) paged KV cache: the scoring core of the needle grid and of
``continuation_nll``.

    prefill prompt[:split]  ->  prune it with the press (if any)  ->  prefill prompt[split:]  ->  feed the
    target's tokens but the last one: the logits of ``len(target)`` rows, each predicting a target token.

With no press this equals one prefill of ``prompt + target[:-1]``. Cache slots and RoPE positions are
tracked apart: after pruning, token ``p`` of the sequence sits at slot ``p - evicted``.
"""

from __future__ import annotations

from longctx.memory import blocks_for_tokens


def forward_at(model, cache, table, ids, slot: int, rows, position: int | None = None, block_size: int = 16):
    """Logits (float32) of ``rows`` after running ``ids`` at cache slots ``slot..`` and positions
    ``position..`` (default ``slot``); the cache already holds slots ``0..slot-1`` of block table
    ``table``."""
    import torch

    from longctx.kv.cache import ChunkSlots
    from longctx.kv.hybrid import layer_metadata

    dev = next(model.parameters()).device
    chunk = ChunkSlots(table, slot, len(ids), first_position=position)
    meta = layer_metadata(model.config, [chunk], block_size, dev)
    with torch.inference_mode():
        out = model(torch.tensor(ids, device=dev), cache, meta, logits_rows=torch.tensor(rows, device=dev))
    return out.float()


def forced_logits(model, cache, table, prompt_ids, target_ids, press=None, split: int | None = None,
                  block_size: int = 16, chunk_size: int | None = None):
    """``(logits [len(target), vocab], slots the prompt holds)``: row ``i`` predicts ``target_ids[i]``.

    ``press`` prunes ``prompt_ids[:split]`` (default: the whole prompt) once it is prefilled, then the
    rest of the prompt and the target run on the pruned cache (question-agnostic pruning when ``split``
    is where the question starts). Without a press, ``chunk_size`` prefills the prompt in chunks and then
    runs the target on top, as an engine does: every chunk after the first and every target token read
    earlier keys back from ``cache`` (what a quantized pool changes); None: one pass over everything."""
    import torch

    P, m = len(prompt_ids), len(target_ids)
    if m < 1 or P < 1:
        raise ValueError(f"need a prompt and a target of at least one token each, got {P} and {m}")
    if press is None and chunk_size is not None:
        for start in range(0, P, int(chunk_size)):
            stop = min(P, start + int(chunk_size))
            first = forward_at(model, cache, table, prompt_ids[start:stop], start, [stop - start - 1],
                               block_size=block_size)
        if m == 1:
            return first, P
        rest = forward_at(
            model, cache, table, list(target_ids[:-1]), P, list(range(m - 1)), block_size=block_size
        )
        return torch.cat([first, rest]), P
    if press is None:
        logits = forward_at(model, cache, table, list(prompt_ids) + list(target_ids[:-1]), 0,
                            list(range(P - 1, P + m - 1)), block_size=block_size)
        return logits, P
    from longctx.engine.pruning import PressRecorder

    split = P if split is None else int(split)
    if not 1 <= split <= P:
        raise ValueError(f"split must be in [1, {P}], got {split}")
    press.check_prompt(split)
    recorder = PressRecorder(press, model)
    with recorder.recording([(0, 0, True)]):
        first = forward_at(model, cache, table, prompt_ids[:split], 0, [split - 1], block_size=block_size)
    cached = split - recorder.compress(cache, table, 0, split)
    if split < P:  # the rest of the prompt (the question), on top of the pruned part
        first = forward_at(
            model, cache, table, prompt_ids[split:], cached, [P - split - 1], split, block_size
        )
        cached += P - split
    if m == 1:
        return first, cached
    rest = forward_at(model, cache, table, target_ids[:-1], cached, list(range(m - 1)), P, block_size)
    return torch.cat([first, rest]), cached


def continuation_nll(model, context_ids, continuation_ids, press=None, block_size: int = 16) -> float:
    """Mean negative log-likelihood (nats per token) of ``continuation_ids`` after ``context_ids``, the
    context's KV cache pruned by ``press`` (None: the full cache): what pruning costs a language model."""
    import torch

    from longctx.kv.cache import PagedKVCache

    p = next(model.parameters())
    num_blocks = blocks_for_tokens(len(context_ids) + len(continuation_ids), block_size)
    cache = PagedKVCache.for_model(model.config, num_blocks, block_size, p.device, p.dtype)
    logits, _ = forced_logits(
        model, cache, list(range(num_blocks)), list(context_ids), list(continuation_ids), press,
        block_size=block_size,
    )
    targets = torch.tensor(list(continuation_ids), device=logits.device)
    return float(-torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).mean())
