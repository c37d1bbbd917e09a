"""``TorchExecutor``: runs a ``ScheduledBatch`` on the real model over the paged KV cache.

The only engine module that imports torch (with ``llm`` and ``exactness``, which build on it). Each step:
gather the batch's new tokens (prefill chunks and decodes, concatenated), build the attention metadata
from the block tables, run one forward pass, choose the next token of every sequence from the logits of
its last row (greedy, or its ``SamplingParams``: ``longctx.engine.sampler``; a request asking for prompt
log-probabilities has the logits of all its prompt rows computed too), prune the prompts a press
finished compressing, and report the wall time the step took.
"""

from __future__ import annotations

import contextlib
import time

import torch

from longctx.engine.batch import ScheduledBatch
from longctx.engine.executor import ExecutionResult, Executor
from longctx.engine.sampler import Sampler
from longctx.kv.block_manager import BlockManager
from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata
from longctx.kv.hybrid import HybridBlockManager, build_grouped_metadata
from longctx.kv.press import Press
from longctx.model.attention import choose_backend


class TorchExecutor(Executor):
    """Decoding with ``model`` (a ``longctx.model.llama.Llama``) over a paged KV cache.

    The cache tensors are built from ``block_manager`` (its ``num_blocks`` x ``block_size`` slots), and the
    executor keeps it as ``self.block_manager``: give the executor to ``Engine`` and the engine uses that
    same pool (one description of the pool, no second copy to keep in sync). ``kv_dtype`` is how the
    pool stores K and V (``longctx.kv.quant``; default: the model's dtype); ``press`` prunes each prompt's
    cache when its prefill ends (``longctx.kv.press``). Each sequence's next token follows its
    ``Sequence.sampling`` (None: greedy). ``attention_backend`` (``auto``, ``reference``, ``fused``:
    ``longctx.model.attention.choose_backend``; None: what the model was built with) is chosen once, knowing
    the pool; ``attention_backend_choice`` says which one runs and why.
    """

    def __init__(self, model, block_manager: BlockManager, device=None, dtype=None,
                 press: Press | None = None, kv_dtype: str | None = None,
                 attention_backend: str | None = None):
        if not isinstance(block_manager, (BlockManager, HybridBlockManager)):
            raise ValueError(
                f"TorchExecutor(model, block_manager): give a BlockManager (the KV pool), "
                f"got {type(block_manager).__name__}"
            )
        self._hybrid = isinstance(block_manager, HybridBlockManager)
        if model.config.is_hybrid != self._hybrid:
            wanted = "a HybridBlockManager (kv_cache_groups)" if model.config.is_hybrid else "a BlockManager"
            raise ValueError(f"model {model.config.name!r} needs {wanted} for its KV pool "
                             f"(block_manager_for), got {type(block_manager).__name__}")
        if press is not None and self._hybrid:
            raise ValueError("KV presses are not supported on a model with sliding-window layers "
                             f"({model.config.name}): they compact every layer's blocks alike")
        p = next(model.parameters())
        self.model = model
        self.block_manager = block_manager
        self.device = p.device if device is None else torch.device(device)
        if press is not None and block_manager.enable_prefix_caching:
            raise ValueError(
                "KV pruning compacts each sequence's kept keys inside its own blocks, so its blocks "
                "cannot be shared: use a press or prefix caching "
                "(BlockManager(enable_prefix_caching=True)), not both"
            )
        self.cache = PagedKVCache.for_pool(model.config, block_manager, self.device, dtype or p.dtype,
                                           kv_dtype)
        requested = attention_backend or model.attention_backend.requested
        self.attention_backend_choice = choose_backend(
            requested, self.device, self.cache.dtype, pool_in_model_dtype=self.cache.format is None,
            block_size=block_manager.block_size, head_dim=model.config.head_dim,
            sliding_window=model.config.is_hybrid)
        self.press = press
        self.decode_graphs = None  # longctx.engine.cuda_graphs.attach_decode_graphs sets it
        self.sampler = Sampler()
        self._pruning = None
        if press is not None:
            from longctx.engine.pruning import PressRecorder

            self._pruning = PressRecorder(press, model)

    def check_prompt(self, num_tokens: int) -> None:
        """Refuse a prompt the press cannot handle (``Engine.add_request`` asks before admitting it)."""
        if self.press is not None:
            self.press.check_prompt(num_tokens)

    def forget(self, seq_id: int) -> None:
        """Drop the sampler's generator and what the press collected for ``seq_id`` (finished or aborted)."""
        self.sampler.forget(seq_id)
        if self._pruning is not None:
            self._pruning.forget(seq_id)

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    def _run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[int]]:
        """Logits of the last new token of every entry (and of every new token of an entry whose request asks
        for prompt log-probabilities), and the index of each entry's last row among them."""
        ids, chunks, rows, last_rows, prefills, row = [], [], [], [], [], 0
        tables = self.block_manager.block_table
        hybrid = self._hybrid
        for seq, n in batch.entries:
            start = seq.num_computed_tokens  # the position of the first new token
            if n == 1 and start >= len(seq.prompt_token_ids):  # a decode: its last output token
                ids.append(seq.output_token_ids[start - len(seq.prompt_token_ids)])
            else:
                ids += seq.token_ids(start, start + n)
            if hybrid:
                chunks.append((seq.seq_id, seq.num_cached_tokens, n, start))
            else:
                chunks.append(ChunkSlots(tables(seq.seq_id), seq.num_cached_tokens, n, first_position=start))
            if not seq.is_decode:
                prefills.append((seq.seq_id, row, start == 0))
            every_row = (seq.sampling is not None and seq.sampling.prompt_logprobs is not None
                         and not seq.is_decode)
            rows += range(row, row + n) if every_row else [row + n - 1]
            row += n
            last_rows.append(len(rows) - 1)
        if self.decode_graphs is not None and (logits := self.decode_graphs.run(ids, chunks)) is not None:
            return logits, last_rows  # a decode-only step replayed from its CUDA graph
        backend = self.attention_backend_choice.backend  # BackendChoice: .name, .reason
        groups = backend.uses_decode_groups
        if hybrid:
            meta = build_grouped_metadata(self.block_manager, chunks, self.device, decode_groups=groups)
        else:
            meta = build_attention_metadata(chunks, self.block_size, self.device, decode_groups=groups)
        picked = None if row == len(rows) else torch.tensor(rows, device=self.device)
        recording = contextlib.nullcontext() if self._pruning is None else self._pruning.recording(prefills)
        with torch.inference_mode(), recording:
            logits = self.model(torch.tensor(ids, device=self.device), self.cache, meta, logits_rows=picked,
                                backend=backend)
        return logits, last_rows

    def _prune(self, batch: ScheduledBatch) -> dict[int, int]:
        """Apply the press to the prefills this step completed (and roll a rolling press's window)."""
        evicted = {}
        with torch.inference_mode():
            for entry in batch.entries:
                seq = entry.seq
                if entry.is_decode:
                    act = self._pruning.roll
                elif entry.completes_prefill:
                    act = self._pruning.compress
                else:
                    continue  # a prefill chunk that is not the last
                # after this step (the engine updates it later)
                cached = seq.num_cached_tokens + entry.num_tokens
                gone = act(self.cache, self.block_manager.block_table(seq.seq_id), seq.seq_id, cached)
                if gone:
                    evicted[seq.seq_id] = gone
        return evicted

    def execute(self, batch: ScheduledBatch) -> ExecutionResult:
        t0 = time.perf_counter()
        logits, last_rows = self._run(batch)
        next_ids = self.sampler(logits, batch, last_rows)  # greedy or each sequence's SamplingParams (waits)
        evicted = self._prune(batch) if self._pruning is not None else None
        return ExecutionResult(duration_s=time.perf_counter() - t0, next_token_ids=next_ids,
                               evicted_tokens=evicted or None)
