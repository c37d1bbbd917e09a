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

from dataclasses import dataclass
from typing import Protocol

import torch

from longctx.model.attention_ops import attention_weights, causal_mask, fresh_prompt, prefill_keys, sdpa
from longctx.model.choices import BACKEND_NAMES

# sdpa, causal_mask and attention_weights live in attention_ops and are importable from here too
__all__ = ["BACKEND_NAMES", "NO_ATTENTION", "REFERENCE", "AttentionBackend", "BackendChoice",
           "ReferenceBackend", "attention_weights", "causal_mask", "choose_backend", "sdpa"]

# query rows x keys x heads per attention call (reference backend's memory guard)
MAX_SCORES_PER_CALL = 1 << 24


class AttentionBackend(Protocol):
    """Attends one step: ``q`` [T, H, d] (after RoPE), the step's fresh ``k``/``v`` [T, H_kv, d], the layer's
    flat pool ``k_cache``/``v_cache`` [num_slots, H_kv, d] (the new keys already written), ``meta``
    (``longctx.kv.cache.AttentionMetadata``). Writes the result into ``out`` [T, H, d]."""

    name: str
    uses_decode_groups: bool  # does it read ``meta.decode_groups`` (the padded decode batches)?

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None: ...


class ReferenceBackend:
    """Today's readable path: SDPA per prefill chunk (query tiles with an explicit mask after a prefix) and
    per padded decode group. Serves everything; the only backend that runs probes."""

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
        window = meta.window
        if kv_len == n and (window is None or n <= window):
            fresh_prompt(q, keys, values, start, n, out)
            return
        num_heads = q.shape[1]
        rows = max(1, MAX_SCORES_PER_CALL // (kv_len * num_heads))
        for r0 in range(0, n, rows):  # query tiles bound the [rows, kv_len] mask and scores on long prompts
            r1 = min(n, r0 + rows)
            qi = q[start + r0 : start + r1].transpose(0, 1).unsqueeze(0)  # [1, H, r1-r0, d]
            # query row j (position kv_len - n + j) sees the keys at positions <= its own (and, in a
            # sliding layer, > its own - window)
            mask = causal_mask(kv_len, kv_len - n + r0, kv_len - n + r1, q.device, window)
            o = sdpa(qi, keys, values, mask=mask)
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


class NoAttention:
    """An intervention, not a backend to serve with: attention's output is its queries, no work done. Passed
    as ``Llama.forward(..., backend=NO_ATTENTION)`` it removes attention from a step to measure the rest
    (lesson 04's ablation, ``benchmarks/compute_wall.py``)."""

    name = "none"
    uses_decode_groups = False

    def attend(self, q, k, v, k_cache, v_cache, meta, out, probe=None) -> None:
        out.copy_(q)


NO_ATTENTION = NoAttention()


@dataclass(frozen=True)
class BackendChoice:
    """The backend that will run (``backend.name``) and why it was chosen."""

    backend: AttentionBackend
    requested: str
    reason: str

    @property
    def name(self) -> str:
        return self.backend.name


def choose_backend(requested: str, device, dtype: torch.dtype, pool_in_model_dtype: bool = True,
                   block_size: int | None = None, head_dim: int | None = None,
                   sliding_window: bool = False) -> BackendChoice:
    """Resolve ``requested`` (``auto``, ``reference`` or ``fused``) for a model on ``device`` in ``dtype``
    whose KV pool stores K/V in the model's dtype (``pool_in_model_dtype``; False for fp8/int8/int4 or cast
    pools).

    ``auto``: ``fused`` on CUDA in bf16/fp16 with such a pool, else ``reference``. ``fused`` asked for where
    it cannot serve is an error that says what is allowed: a pool in another format, a model with
    sliding-window layers (``sliding_window``: its masks are not in the fused kernels yet), or on CUDA a model
    in fp32, a block size that is not a multiple of 16 or a head smaller than 16 (the compiled kernels'
    smallest tiles). On a CPU it is allowed and runs eagerly."""
    if requested not in BACKEND_NAMES:
        raise ValueError(f"attention backend must be one of {', '.join(BACKEND_NAMES)}; got {requested!r}")
    if requested == "reference":
        return BackendChoice(REFERENCE, requested, "asked for")
    cuda = torch.device(device).type == "cuda"
    unfit = _unfit_for_fused(cuda, dtype, pool_in_model_dtype, block_size, head_dim, sliding_window)
    if requested == "fused":
        if unfit:
            raise ValueError(f"the fused attention backend cannot serve this: {unfit}; "
                             "use --attention-backend reference (or auto)")
        return BackendChoice(_fused(), requested, "asked for" + ("" if cuda else " (on a CPU: eager, slow)"))
    if not cuda:
        return BackendChoice(REFERENCE, requested, "auto: not on CUDA")
    if unfit:
        return BackendChoice(REFERENCE, requested, f"auto: {unfit}")
    return BackendChoice(_fused(), requested, "auto: CUDA, half precision, pool in the model's dtype")


def _unfit_for_fused(cuda: bool, dtype: torch.dtype, pool_in_model_dtype: bool, block_size,
                     head_dim, sliding_window: bool = False) -> str | None:
    """Why the fused backend cannot serve (None: it can)."""
    if sliding_window:
        return "the model has sliding-window layers, whose masks only the reference backend applies"
    if cuda and dtype not in (torch.bfloat16, torch.float16):
        return f"on CUDA it serves bf16 or fp16 models, got {dtype} (--dtype bf16, or the reference backend)"
    if not pool_in_model_dtype:
        return ("it reads the KV pool in place, so the pool must store K/V in the model's dtype; this pool "
                "is quantized or cast (--kv-dtype fp8/int8/int4 needs the reference backend)")
    if cuda and block_size is not None and block_size % 16:
        return f"on CUDA its kernels read KV blocks of a multiple of 16 tokens, got block_size={block_size}"
    if cuda and head_dim is not None and head_dim < 16:
        return f"on CUDA its kernels need head_dim >= 16, got {head_dim}"
    return None


def _fused() -> AttentionBackend:
    from longctx.model.paged_flex import FusedBackend

    return FusedBackend()
