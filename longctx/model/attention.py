"""Attention over the paged KV cache, behind one small seam: an ``AttentionBackend`` attends one step.

``Attention.forward`` (``longctx.model.llama``) projects q, k, v, applies RoPE, writes the new keys and values
at their pool slots, then hands the step to the model's backend, chosen once (``choose_backend``):

- ``reference`` (this module): readable SDPA code, one call per prefill chunk and per decode group. A chunk
  after a prefix reads its keys back through the block table and is masked in query tiles
  (``MAX_SCORES_PER_CALL`` bounds the mask and the scores on a CPU); decodes are gathered into a padded
  batch. It serves every dtype and every pool (quantized pools decode as they are read) and the probes that
  KV presses and attention readers install.
- ``fused`` (``longctx.model.paged_flex``): for CUDA in bf16/fp16. A chunk after a prefix in ONE call with
  bottom-right causal masking (no tiles, no mask tensor on CUDA); all decodes of the step in ONE
  FlexAttention call that reads the paged pool in place (a block mask built from the block tables).
  It runs eagerly on a CPU too (slowly: for tests and for the curious).

The one fallback rule: a layer with a ``probe`` installed always attends with the reference backend (a probe
reads each sequence's keys one by one). ``auto`` picks ``fused`` on CUDA in bf16/fp16 with a pool stored in
the model's dtype, else ``reference``; ``BackendChoice.reason`` says why, and the engine, ``doctor`` and the
GPU record name the backend that ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

BACKEND_NAMES = ("auto", "reference", "fused")
MAX_SCORES_PER_CALL = 1 << 24  # query rows x keys x heads per attention call (reference backend's memory guard)


def sdpa(q, k, v, mask=None, is_causal=False):
    """Scaled dot-product attention with GQA: q [B, H, n, d], k/v [B, H_kv, L, d] -> [B, H, n, d].

    Each group of ``H / H_kv`` query heads reads the same K/V head (``enable_gqa``: no copies). ``mask`` is a
    boolean (True = attend) or additive tensor broadcastable to [B, H, n, L], or a ``torch.nn.attention.bias``
    object such as ``causal_lower_right``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)


def causal_mask(kv_len: int, first: int, stop: int, device=None) -> torch.Tensor:
    """``[stop - first, kv_len]`` booleans: query at position ``p`` (rows ``first … stop - 1``) sees keys ``<= p``."""
    q_pos = torch.arange(first, stop, device=device)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos[:, None]


def attention_weights(queries: torch.Tensor, keys: torch.Tensor, tile_rows: int = 256) -> torch.Tensor:
    """Causal softmax weights of the last ``n`` queries over all ``T`` keys: ``[H, n, T]`` (float32, scale
    ``1/sqrt(d)``): what KV presses score with and what attention readers record.

    queries ``[H, n, d]`` are positions ``T - n … T - 1``; keys ``[H_kv, T, d]``; query head ``h`` reads
    KV head ``h // (H / H_kv)``."""
    H, n, d = queries.shape
    H_kv, T, _ = keys.shape
    k = keys.float().repeat_interleave(H // H_kv, dim=0)  # [H, T, d]
    out = torch.empty(H, n, T, device=keys.device)
    for r0 in range(0, n, tile_rows):  # query tiles bound the [H, rows, T] scores on long prompts
        r1 = min(n, r0 + tile_rows)
        scores = queries[:, r0:r1].float() @ k.transpose(1, 2) / math.sqrt(d)  # [H, rows, T]
        scores.masked_fill_(~causal_mask(T, T - n + r0, T - n + r1, keys.device), float("-inf"))
        out[:, r0:r1] = scores.softmax(dim=-1)
    return out


class AttentionBackend(Protocol):
    """Attends one step: ``q`` [T, H, d] (after RoPE), the step's fresh ``k``/``v`` [T, H_kv, d], the layer's
    flat pool ``k_cache``/``v_cache`` [num_slots, H_kv, d] (the new keys already written), ``meta``
    (``longctx.kv.cache.AttentionMetadata``). Writes the result into ``out`` [T, H, d]."""

    name: str
    uses_decode_groups: bool  # does it read ``meta.decode_groups`` (the padded decode batches)?

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None: ...


def prefill_keys(k, v, k_cache, v_cache, meta, i):
    """Keys and values of prefill chunk ``i`` as ``[1, H_kv, kv_len, d]``: the fresh ones when nothing is cached
    yet, else read back from the pool through its block table (a view when its blocks are consecutive)."""
    start, n, kv_len = meta.q_starts[i], meta.q_lens[i], meta.kv_lens[i]
    if kv_len == n:
        keys, values = k[start : start + n], v[start : start + n]
    else:
        index = meta.kv_index[i]  # a slice (consecutive blocks) or a gather
        keys, values = k_cache[index], v_cache[index]  # [kv_len, H_kv, d]
    return keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0)


def fresh_prompt(q, keys, values, start, n, out) -> None:
    """A chunk with nothing cached: one causal call (fused kernels skip the masked half, store no scores)."""
    qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, H, n, d]
    out[start : start + n] = sdpa(qi, keys, values, is_causal=True).squeeze(0).transpose(0, 1)


class ReferenceBackend:
    """Today's readable path: SDPA per prefill chunk (query tiles with an explicit mask after a prefix) and per
    padded decode group. Serves everything; the only backend that runs probes."""

    name = "reference"
    uses_decode_groups = True

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None:
        for i in meta.prefill_indices:
            self._prefill(q, k, v, k_cache, v_cache, meta, i, out, probe)
        for group in meta.groups():
            self._decodes(q, k_cache, v_cache, group, out, probe)

    def _prefill(self, q, k, v, k_cache, v_cache, meta, i, out, probe) -> None:
        """Chunk i: its n queries attend causally to all kv_len keys of its sequence (cached + new)."""
        start, n, kv_len = meta.q_starts[i], meta.q_lens[i], meta.kv_lens[i]
        keys, values = prefill_keys(k, v, k_cache, v_cache, meta, i)  # [1, H_kv, kv_len, d]
        if probe is not None:
            probe(q[start : start + n], keys, start)
        if kv_len == n:
            fresh_prompt(q, keys, values, start, n, out)
            return
        num_heads = q.shape[1]
        rows = max(1, MAX_SCORES_PER_CALL // (kv_len * num_heads))
        for r0 in range(0, n, rows):  # query tiles bound the [rows, kv_len] mask and scores on long prompts
            r1 = min(n, r0 + rows)
            qi = q[start + r0 : start + r1].transpose(0, 1).unsqueeze(0)  # [1, H, r1-r0, d]
            # query row j (position kv_len - n + j) sees the keys at positions <= its own
            o = sdpa(qi, keys, values, mask=causal_mask(kv_len, kv_len - n + r0, kv_len - n + r1, q.device))
            out[start + r0 : start + r1] = o.squeeze(0).transpose(0, 1)  # [rows, H, d]

    @staticmethod
    def _decodes(q, k_cache, v_cache, group, out, probe) -> None:
        """A group of decodes at once: one query each, keys padded to the group's longest context."""
        qd = q[group.rows].unsqueeze(2)  # [B, H, 1, d]
        keys = group.gather(k_cache).transpose(1, 2)  # [B, L, H_kv, d] -> [B, H_kv, L, d]
        values = group.gather(v_cache).transpose(1, 2)
        mask = None if group.mask is None else group.mask[:, None, None, :]  # [B, 1, 1, L]
        out[group.rows] = sdpa(qd, keys, values, mask=mask).squeeze(2)  # [B, H, d]
        if probe is not None:  # one call per sequence, its own keys only
            rows = range(len(q))[group.rows] if isinstance(group.rows, slice) else group.rows.tolist()
            lens = [group.max_len] * len(rows) if group.mask is None else group.mask.sum(-1).tolist()
            for b, (r, L) in enumerate(zip(rows, lens, strict=True)):
                probe(q[r : r + 1], keys[b : b + 1, :, :L], r)


REFERENCE = ReferenceBackend()


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run (``backend.name``) and why it was chosen."""

    backend: AttentionBackend
    requested: str
    reason: str

    @property
    def name(self) -> str:
        return self.backend.name


def choose_backend(requested: str, device, dtype: torch.dtype, pool_in_model_dtype: bool = True) -> BackendChoice:
    """Resolve ``requested`` (``auto``, ``reference`` or ``fused``) for a model on ``device`` in ``dtype`` whose KV
    pool stores K/V in the model's dtype (``pool_in_model_dtype``; False for fp8/int8/int4 or cast pools).

    ``auto``: ``fused`` on CUDA in bf16/fp16 with such a pool, else ``reference``. ``fused`` asked for where it
    cannot serve (a pool in another format) is an error that says what is allowed; on a CPU it is allowed and
    runs eagerly."""
    if requested not in BACKEND_NAMES:
        raise ValueError(f"attention backend must be one of {', '.join(BACKEND_NAMES)}; got {requested!r}")
    cuda = torch.device(device).type == "cuda"
    if requested == "reference":
        return BackendChoice(REFERENCE, requested, "asked for")
    if requested == "fused":
        if not pool_in_model_dtype:
            raise ValueError(
                "the fused attention backend reads the KV pool in place, so the pool must store K/V in the "
                f"model's dtype ({dtype}); this pool is quantized or cast: use --attention-backend reference "
                "(or auto) with --kv-dtype fp8/int8/int4, or drop --kv-dtype"
            )
        return BackendChoice(_fused(), requested, "asked for" + ("" if cuda else " (on a CPU: eager, slow)"))
    if not cuda:
        return BackendChoice(REFERENCE, requested, "auto: not on CUDA")
    if dtype not in (torch.bfloat16, torch.float16):
        return BackendChoice(REFERENCE, requested, f"auto: {dtype} (fused serves bf16/fp16)")
    if not pool_in_model_dtype:
        return BackendChoice(REFERENCE, requested, "auto: the KV pool is quantized or cast")
    return BackendChoice(_fused(), requested, "auto: CUDA, half precision, pool in the model's dtype")


def _fused() -> AttentionBackend:
    from longctx.model.paged_flex import FusedBackend

    return FusedBackend()
