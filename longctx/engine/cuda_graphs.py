"""CUDA graphs for decode-only steps: record a step's ~1,600 kernel launches once, replay them with one call.

A decode step of an eager PyTorch model is launch-bound at small batches: every layer issues a few dozen
small kernels, each costing the host a few microseconds to enqueue. A CUDA graph records the kernels of one
step and replays them all from one host call. It replays the SAME kernels on the SAME memory, so everything a
step varies must live in buffers that are refilled in place before each replay (as nano-vllm's and vLLM's
model runners do):

- per batch bucket of ``Bp`` rows (``graph_buckets``: powers of two, matching the fused backend's compiled
  decode kernels): token ids, positions and pool slots [Bp]; the decode block mask's tensors, whose block
  table is padded to a fixed width (``max_blocks`` blocks per sequence); the mask function's context
  lengths and block ranks (the fused backend's ``DecodeMask`` of ``Bp`` rows, already refilled in place);
- a step of ``B`` decodes fills rows ``0 … B-1``; rows ``B … Bp-1`` are padding: token 0 at position 0,
  writing its key and value to a **scratch slot** (the first slot of one pool block reserved for it) and
  attending to that one slot, so a padded row computes finite numbers and touches no sequence's cache;
- a bucket is captured the first time a step needs it, after two warm-up runs through the same buffers (the
  compiled FlexAttention kernel is built then, outside the capture), on a memory pool shared by all buckets;
  its logits buffer [Bp, vocab] is the graph's output: rows ``0 … B-1`` are the step's.

Only the fused attention backend is graphed: its decode kernel reads the paged pool through the block mask,
so a fixed-width table costs nothing; the reference backend gathers every row's keys to the longest context,
which a fixed shape would pad to ``max_blocks``. ``DecodeGraphs(..., capture=False)`` runs the same buffers
eagerly: what the CPU tests check against the normal path (the capture alone needs a GPU). A capture that
fails is recorded in ``failure`` (its error's first line) and the executor goes back to eager steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from longctx.kv.cache import AttentionMetadata, ChunkSlots
from longctx.memory import blocks_for_tokens
from longctx.model.paged_flex import PagedDecodes, batch_bucket, paged_decodes

SCRATCH_SEQ_ID = -1  # the block manager's owner of the scratch block (engine sequences count from 0)
CUDA_GRAPH_MODES = ("auto", "off")
MAX_GRAPH_BATCH = 256


def graph_buckets(max_batch: int = MAX_GRAPH_BATCH) -> tuple[int, ...]:
    """Batch sizes that get a graph: 1, 2, 4, … up to ``batch_bucket(max_batch)`` (a step of ``B`` decodes
    replays the graph of ``batch_bucket(B)`` rows)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    return tuple(1 << i for i in range(batch_bucket(max_batch).bit_length()))


@dataclass
class PaddedDecodeStep:
    """A decode-only step laid out in ``bucket`` rows (host lists; rows past ``num_decodes`` are padding)."""

    num_decodes: int
    bucket: int
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    decodes: list[tuple[int, list[int], int]]  # (row, block table, kv_len): the fused backend's decodes


def pad_decode_step(ids, chunks, bucket: int, block_size: int, scratch_block: int) -> PaddedDecodeStep:
    """``ids`` [B] and ``chunks`` (one ``ChunkSlots`` with one new token each) padded to ``bucket`` rows.

    Row ``b < B``: its token at position ``first_position`` (or ``num_cached``), written to the slot of
    position ``num_cached`` of its table, attending to ``num_cached + 1`` keys. A padded row: token 0 at
    position 0 in the scratch slot ``scratch_block * block_size``, attending to that slot only (a step of
    padded rows alone, ``B = 0``, is how a bucket is captured before any real step)."""
    B = len(chunks)
    if not 0 <= B <= bucket or len(ids) != B:
        raise ValueError(f"a padded decode step needs B <= bucket ids and chunks; got {len(ids)} ids, "
                         f"{B} chunks, bucket {bucket}")
    positions, slot_mapping, decodes = [], [], []
    for row, chunk in enumerate(chunks):
        table, cached, new, first = ChunkSlots(*chunk)
        if new != 1:
            raise ValueError(f"row {row} has {new} new tokens: a decode step has one per sequence")
        positions.append(cached if first is None else first)
        slot_mapping.append(table[cached // block_size] * block_size + cached % block_size)
        decodes.append((row, table, cached + 1))
    scratch = scratch_block * block_size
    pad = bucket - B
    return PaddedDecodeStep(B, bucket, list(ids) + [0] * pad, positions + [0] * pad,
                            slot_mapping + [scratch] * pad,
                            decodes + [(row, [scratch_block], 1) for row in range(B, bucket)])


@dataclass
class GraphStats:
    """What ran: steps replayed from a graph (or, with ``capture=False``, run through the graph's buffers),
    steps left eager (and why, counted), buckets captured and the seconds their captures took."""

    replayed: int = 0
    eager: dict[str, int] = field(default_factory=dict)
    captured: list[int] = field(default_factory=list)
    capture_s: float = 0.0

    def eager_step(self, why: str) -> None:
        self.eager[why] = self.eager.get(why, 0) + 1


class _Bucket:
    """The fixed buffers of one batch bucket, its metadata over them, and its graph once captured."""

    def __init__(self, rows: int, max_blocks: int, block_size: int, device, decode_mask):
        i32 = {"dtype": torch.int32, "device": device}
        self.rows = rows
        self.tokens = torch.zeros(3, rows, dtype=torch.long, device=device)  # ids, positions, slots
        self.kv_num_blocks = torch.zeros(rows, 1, 1, **i32)  # 1 where the last block is partly filled
        self.kv_indices = torch.zeros(rows, 1, 1, 1, **i32)  # that block
        self.full_kv_num_blocks = torch.zeros(rows, 1, 1, **i32)
        self.full_kv_indices = torch.zeros(rows, 1, 1, max_blocks, **i32)  # the block table, fixed width
        from torch.nn.attention.flex_attention import BlockMask

        mask = BlockMask.from_kv_blocks(
            self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices,
            BLOCK_SIZE=(16, block_size), mask_mod=decode_mask.mask_mod,
            seq_lengths=(1, decode_mask.num_blocks * block_size), compute_q_blocks=False)
        self.meta = AttentionMetadata(
            slot_mapping=self.tokens[2], positions=self.tokens[1], q_starts=list(range(rows)),
            q_lens=[1] * rows, kv_lens=[1] * rows, kv_index=[None] * rows,
            decodes=[(r, [], 1) for r in range(rows)], block_size=block_size,
            scratch={"paged_decodes": PagedDecodes(torch.arange(rows, device=device), mask)})
        self.graph = None
        self.logits = None  # the graph's output [rows, vocab]

    def fill(self, step: PaddedDecodeStep, paged: PagedDecodes) -> None:
        """Copy ``step``'s ids, positions and slots and ``paged``'s block mask into the buffers, in place."""
        host = torch.tensor([step.input_ids, step.positions, step.slot_mapping], dtype=torch.long)
        self.tokens.copy_(host, non_blocking=True)
        bm = paged.block_mask
        self.kv_num_blocks.copy_(bm.kv_num_blocks)
        self.kv_indices.copy_(bm.kv_indices)
        self.full_kv_num_blocks.copy_(bm.full_kv_num_blocks)
        width = bm.full_kv_indices.shape[-1]
        self.full_kv_indices[..., :width].copy_(bm.full_kv_indices)
        self.full_kv_indices[..., width:].zero_()


class DecodeGraphs:
    """Decode-only steps of ``model`` over ``cache`` through per-bucket buffers, replayed from CUDA graphs.

    ``block_manager``: the pool's manager; one of its blocks is reserved for the scratch slot (owned by
    ``SCRATCH_SEQ_ID``). ``backend``: the fused backend the model attends with. ``max_batch``: the largest
    bucket; ``max_blocks``: the block table's fixed width (default: every block of the pool, which no
    sequence can exceed). ``capture``: False runs the buffers eagerly (CPU tests); True needs CUDA.
    ``run(ids, chunks)`` returns the step's logits [B, vocab] (valid until the next step), or None when the
    step is not for a graph (then the caller runs it eagerly; ``stats.eager`` counts why)."""

    def __init__(self, model, cache, block_manager, backend, max_batch: int = MAX_GRAPH_BATCH,
                 max_blocks: int | None = None, capture: bool = True):
        if backend.name != "fused":
            raise ValueError(f"decode graphs need the fused attention backend, got {backend.name!r}")
        if capture and cache.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the cache is on {cache.device} "
                             "(capture=False runs the same buffers eagerly)")
        self.model, self.cache, self.backend, self.capture = model, cache, backend, capture
        self.block_size = block_manager.block_size
        self.max_batch = batch_bucket(max_batch)
        self.max_blocks = max(2, max_blocks or block_manager.num_blocks)
        self.scratch_block = block_manager.allocate(SCRATCH_SEQ_ID, 1)[0]
        # the backend's own decode masks
        self._masks = backend.decode_state(cache.flat(0)[0], self.block_size, cache.device)
        self._buckets: dict[int, _Bucket] = {}
        self._pool = None
        self.stats = GraphStats()
        self.failure: str | None = None  # why graphs stopped (a capture failed), or None

    @torch.inference_mode()
    def run(self, ids, chunks) -> torch.Tensor | None:
        why = self._unfit(chunks)
        if why is not None:
            self.stats.eager_step(why)
            return None
        bucket = self._filled(ids, chunks, batch_bucket(len(chunks)))
        if not self.capture:
            logits = self._forward(bucket)
        else:
            if bucket.graph is None and not self._capture(bucket):
                self.stats.eager_step("capture failed")
                return None
            bucket.graph.replay()
            logits = bucket.logits
        self.stats.replayed += 1
        return logits[: len(chunks)]

    @torch.inference_mode()
    def warm(self, buckets) -> None:
        """Capture the graph of each of ``buckets`` (largest first, as nano-vllm does) from a step of padded
        rows only, so that no capture falls inside a timed run; eagerly (``capture=False``), run them."""
        for rows in sorted({batch_bucket(b) for b in buckets if b <= self.max_batch}, reverse=True):
            if self.failure is not None:
                return
            bucket = self._filled([], [], rows)
            if not self.capture:
                self._forward(bucket)
            elif bucket.graph is None:
                self._capture(bucket)

    def _filled(self, ids, chunks, rows: int) -> _Bucket:
        """The bucket of ``rows`` rows (made on first use), its buffers holding this step."""
        step = pad_decode_step(ids, chunks, rows, self.block_size, self.scratch_block)
        bucket = self._buckets.get(rows)
        if bucket is None:
            bucket = self._buckets[rows] = _Bucket(rows, self.max_blocks, self.block_size, self.cache.device,
                                                   self._masks.for_rows(rows))
        bucket.fill(step, paged_decodes(step.decodes, self._masks))
        return bucket

    def _unfit(self, chunks) -> str | None:
        """Why this step runs eagerly (None: it fits a graph)."""
        if self.failure is not None:
            return "graphs off after a failed capture"
        if not chunks or any(ChunkSlots(*c).num_new != 1 for c in chunks):
            return "not decode-only"
        if len(chunks) > self.max_batch:
            return f"over {self.max_batch} decodes"
        if max(blocks_for_tokens(ChunkSlots(*c).num_cached + 1, self.block_size) for c in chunks) > \
                self.max_blocks:
            return f"a block table over {self.max_blocks} blocks"
        if any(layer.attn.probe is not None for layer in self.model.layers):
            return "a probe is installed"
        return None

    def _forward(self, bucket: _Bucket) -> torch.Tensor:
        ids = bucket.tokens[0]
        return self.model(ids, self.cache, bucket.meta, logits_rows=None, backend=self.backend)

    def _capture(self, bucket: _Bucket) -> bool:
        """Warm up (compiles) and capture ``bucket``'s graph; False, with ``failure`` set, when it fails."""
        t0 = time.perf_counter()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(bucket)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                bucket.logits = self._forward(bucket)
            torch.cuda.synchronize()
        except Exception as exc:  # recorded, never fatal: the executor runs this step and the rest eagerly
            first = (str(exc).strip().splitlines() or [""])[0]
            self.failure = f"capture of bucket {bucket.rows} failed: {type(exc).__name__}: {first}"[:300]
            bucket.logits = None
            return False
        self._pool = graph.pool() if self._pool is None else self._pool
        bucket.graph = graph
        self.stats.captured.append(bucket.rows)
        self.stats.capture_s += time.perf_counter() - t0
        return True

    def describe(self) -> dict:
        """What ran, for a record: mode, buckets captured, replays, eager steps by reason, failure."""
        return {"ran": "on" if self.capture and self.failure is None else
                ("eager-buffers" if not self.capture else "off"),
                "buckets_captured": list(self.stats.captured), "capture_s": round(self.stats.capture_s, 3),
                "replayed_steps": self.stats.replayed, "eager_steps": dict(self.stats.eager),
                "failure": self.failure}


def attach_decode_graphs(executor, mode: str = "auto", max_batch: int = MAX_GRAPH_BATCH,
                         capture: bool | None = None) -> str:
    """Give ``executor`` (a ``TorchExecutor``) decode graphs when ``mode`` is ``auto`` and they can run:
    CUDA, the fused backend, no press. Returns what was decided in one line (``"on"`` or ``"off: <why>"``).
    ``capture=False`` (tests) attaches the eager-buffer path on any device."""
    if mode not in CUDA_GRAPH_MODES:
        raise ValueError(f"cuda graphs must be one of {', '.join(CUDA_GRAPH_MODES)}; got {mode!r}")
    executor.decode_graphs = None
    if mode == "off":
        return "off: asked for"
    if capture is None:
        if executor.device.type != "cuda":
            return "off: not on CUDA"
        capture = True
    if executor.attention_backend_choice.name != "fused":
        return f"off: the {executor.attention_backend_choice.name} backend (graphs need the fused one)"
    if executor.press is not None:
        return "off: a KV press prunes between steps"
    if executor.block_manager.num_free_blocks < 1:
        return "off: no free block for the scratch slot"
    executor.decode_graphs = DecodeGraphs(executor.model, executor.cache, executor.block_manager,
                                          executor.attention_backend_choice.backend, max_batch,
                                          capture=capture)
    return "on" if capture else "eager-buffers"
