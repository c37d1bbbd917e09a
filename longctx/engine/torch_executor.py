"""``TorchExecutor``: runs a ``ScheduledBatch`` on the real model over the paged KV cache.

The only engine module that imports torch. Each step: gather the batch's new tokens (prefill chunks and
decodes, concatenated), build the attention metadata from the block tables, run one forward pass, take the
greedy token of the last row of every sequence, and report the wall time the step took.

Also here: ``build_engine`` (an engine on SmolLM2 in one call), ``generate`` (greedy completion of one
prompt) and ``chunked_prefill_logits`` / ``chunked_prefill_max_diff`` (chunked prefill is exact up to
floating-point rounding: measure it).
"""

from __future__ import annotations

import time

import torch

from longctx.engine.clock import Clock
from longctx.engine.engine import Engine
from longctx.engine.executor import ExecutionResult
from longctx.engine.scheduler import ChunkedPrefillScheduler, MonolithicScheduler, ScheduledBatch, Scheduler
from longctx.kv.block_manager import BlockManager, blocks_for_tokens
from longctx.kv.cache import PagedKVCache, build_attention_metadata

DEFAULT_NUM_BLOCKS = 256  # 4096 tokens of 16; for SmolLM2 in fp32: 4096 x 46 KB = 189 MB of KV


class TorchExecutor:
    """Greedy decoding with ``model`` (a ``longctx.model.llama.Llama``) over its own paged KV cache.

    ``num_blocks`` and ``block_size`` must equal the engine's block manager's.
    """

    def __init__(self, model, num_blocks: int, block_size: int = 16, device=None, dtype=None):
        p = next(model.parameters())
        self.model = model
        self.device = p.device if device is None else torch.device(device)
        self.cache = PagedKVCache.for_model(
            model.config, num_blocks, block_size, self.device, dtype or p.dtype
        )
        self.block_size = block_size

    def _run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits ``[len(batch), vocab]`` of the last new token of every entry."""
        ids, chunks, last_rows, row = [], [], [], 0
        for seq, n in batch.entries:
            start = seq.num_computed_tokens
            ids += seq.token_ids(start, start + n)
            chunks.append((batch.block_tables[seq.seq_id], start, n))
            row += n
            last_rows.append(row - 1)
        meta = build_attention_metadata(chunks, self.block_size, self.device)
        with torch.inference_mode():
            return self.model(
                torch.tensor(ids, device=self.device),
                self.cache,
                meta,
                logits_rows=torch.tensor(last_rows, device=self.device),
            )

    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        t0 = time.perf_counter()
        logits = self._run(batch)
        next_ids = logits.argmax(dim=-1).tolist()  # .tolist() waits for the device
        return ExecutionResult(duration_s=time.perf_counter() - t0, next_token_ids=next_ids)


def build_engine(
    scheduler: Scheduler | None = None,
    num_blocks: int = DEFAULT_NUM_BLOCKS,
    block_size: int = 16,
    device="cpu",
    dtype=None,
    clock: Clock | None = None,
    model=None,
):
    """An ``Engine`` running SmolLM2-135M-Instruct on ``device``; returns ``(engine, tokenizer)``.

    The scheduler defaults to ``ChunkedPrefillScheduler(512)``. EOS is ``<|im_end|>``.
    """
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model = model if model is not None else load_model(device=device, dtype=dtype)
    tokenizer = load_tokenizer()
    executor = TorchExecutor(model, num_blocks, block_size)
    engine = Engine(
        executor,
        scheduler if scheduler is not None else ChunkedPrefillScheduler(512),
        BlockManager(num_blocks, block_size),
        clock=clock,
        max_model_len=model.config.max_context,
        eos_token_id=tokenizer.eos_token_id,
        vocab_size=model.config.vocab_size,
    )
    return engine, tokenizer


def generate(
    model,
    prompt_token_ids: list[int],
    max_tokens: int,
    chunk_size: int | None = None,
    eos_token_id: int | None = None,
    block_size: int = 16,
) -> list[int]:
    """Greedy completion of one prompt; prefill in chunks of ``chunk_size`` (None: all at once)."""
    scheduler = MonolithicScheduler() if chunk_size is None else ChunkedPrefillScheduler(chunk_size)
    num_blocks = max(1, blocks_for_tokens(len(prompt_token_ids) + max(1, max_tokens), block_size))
    engine = Engine(
        TorchExecutor(model, num_blocks, block_size),
        scheduler,
        BlockManager(num_blocks, block_size),
        max_model_len=model.config.max_context,
        eos_token_id=eos_token_id,
        vocab_size=model.config.vocab_size,
    )
    seq = engine.add_request(prompt_token_ids, max_tokens)
    engine.run_until_done()
    return seq.output_token_ids


def chunked_prefill_logits(model, token_ids: list[int], chunk_size: int | None, block_size: int = 16):
    """Logits ``[len(token_ids), vocab]`` (float32, CPU) of every prompt position, prefilling the prompt
    through the paged cache in chunks of ``chunk_size`` tokens (None: one monolithic chunk)."""
    n = len(token_ids)
    if n == 0:
        raise ValueError("token_ids is empty")
    chunk = n if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    p = next(model.parameters())
    cache = PagedKVCache.for_model(
        model.config, blocks_for_tokens(n, block_size), block_size, p.device, p.dtype
    )
    table = list(range(cache.num_blocks))
    out = []
    with torch.inference_mode():
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            meta = build_attention_metadata([(table, start, stop - start)], block_size, p.device)
            ids = torch.tensor(token_ids[start:stop], device=p.device)
            out.append(model(ids, cache, meta).float().cpu())
    return torch.cat(out)


def chunked_prefill_max_diff(model, token_ids: list[int], chunk_sizes=(1, 7, 64, 512)) -> dict[int, float]:
    """max |logit(chunked) - logit(monolithic)| over all prompt positions, for each chunk size."""
    reference = chunked_prefill_logits(model, token_ids, None)
    return {
        int(c): float((chunked_prefill_logits(model, token_ids, c) - reference).abs().max())
        for c in chunk_sizes
    }
