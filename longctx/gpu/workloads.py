"""What the GPU suite runs: random-weight Llama models at real shapes, their KV caches and attention
metadata, and the FLOPs and bytes each measured step really executes (for achieved TFLOP/s and TB/s).

Shapes: ``LLAMA3_8B`` (Meta's config) whole, and a Llama-3.1-70B-shaped *slice* (its real layer shape,
a few layers: the 80-layer model's 141 GB of bf16 weights do not fit one GPU beside a KV cache).
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch

from longctx.kv import cache as cache_module
from longctx.kv.cache import AttentionMetadata
from longctx.model import llama as llama_module
from longctx.model.config import LLAMA3_8B, LlamaConfig

# Llama-3.1-70B's layer shape (Meta's config.json; longctx.specs "llama-3.1-70b"), as a few-layer slice.
LLAMA31_70B = LlamaConfig(vocab_size=128256, d_model=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                          head_dim=128, ffn_dim=28672, rope_theta=500000.0, rms_norm_eps=1e-5,
                          max_model_len=131072)

# Tiny shapes for the CPU toy run (seconds end to end); same code paths as the real ones.
TOY = LlamaConfig(vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  ffn_dim=160, max_model_len=1 << 16)
TOY_WIDE = replace(TOY, d_model=128, num_heads=8, head_dim=16, ffn_dim=320, num_layers=1)


def model_configs(toy: bool, slice_layers: int = 4, main_layers: int | None = None) -> dict[str, LlamaConfig]:
    """Name -> config: ``llama-3-8b`` and ``llama-3.1-70b-slice`` (``toy``: tiny stand-ins, same names).
    ``main_layers`` keeps only that many of Llama-3-8B's 32 layers (quick live measurements in lessons)."""
    if toy:
        return {"llama-3-8b": TOY, "llama-3.1-70b-slice": TOY_WIDE}
    main = replace(LLAMA3_8B, max_model_len=1 << 17)
    return {"llama-3-8b": main if main_layers is None else replace(main, num_layers=main_layers),
            "llama-3.1-70b-slice": replace(LLAMA31_70B, num_layers=slice_layers)}


def build_model(config: LlamaConfig, device, dtype, seed: int = 0):
    """A random-weight ``Llama`` in eval mode on ``device`` (no weights file: speed is all we need)."""
    from longctx.model.llama import Llama

    return Llama(config, device=device, dtype=dtype).init_random_(seed).eval()


@contextlib.contextmanager
def scores_per_call(limit: int):
    """Temporarily raise ``longctx.model.llama.MAX_SCORES_PER_CALL`` (it tiles long prefills to bound CPU
    memory; on a 141 GB GPU larger tiles waste fewer kernel launches). Restored on exit."""
    old = llama_module.MAX_SCORES_PER_CALL
    llama_module.MAX_SCORES_PER_CALL = int(limit)
    try:
        yield
    finally:
        llama_module.MAX_SCORES_PER_CALL = old


# ---- attention metadata, vectorised -------------------------------------------------------------------


def _slots(table: torch.Tensor, block_size: int, start: int, stop: int) -> torch.Tensor:
    pos = torch.arange(start, stop)
    return table[pos // block_size] * block_size + pos % block_size  # [stop - start]


def fast_metadata(chunks, block_size: int, device="cpu") -> AttentionMetadata:
    """``longctx.kv.cache.build_attention_metadata`` with tensor ops per sequence instead of Python loops per
    token (a 32K-token decode batch would spend longer building lists than the GPU spends on the step).
    Same inputs, same result: ``chunks`` is ``(block_table, num_computed, num_new)`` per sequence.

    When the engine's own builder is the vectorised one (it groups decodes: ``DecodeGroup``), that one is
    used, so the GPU measures exactly the engine's attention path."""
    if hasattr(cache_module, "DecodeGroup"):
        return cache_module.build_attention_metadata(chunks, block_size, device)
    slot_parts, pos_parts, q_starts, q_lens, kv_lens, kv_slots = [], [], [], [], [], []
    decode_rows, decode_slots = [], []
    row = 0
    for table, num_computed, num_new in chunks:
        t = torch.as_tensor(table, dtype=torch.long)
        kv_len = num_computed + num_new
        slot_parts.append(_slots(t, block_size, num_computed, kv_len))
        pos_parts.append(torch.arange(num_computed, kv_len))
        q_starts.append(row)
        q_lens.append(num_new)
        kv_lens.append(kv_len)
        if num_new == 1:
            decode_rows.append(row)
            decode_slots.append(_slots(t, block_size, 0, kv_len))
            kv_slots.append(None)
        else:
            kv_slots.append(_slots(t, block_size, 0, kv_len).to(device))
        row += num_new
    meta = AttentionMetadata(
        slot_mapping=torch.cat(slot_parts).to(device),
        positions=torch.cat(pos_parts).to(device),
        q_starts=q_starts, q_lens=q_lens, kv_lens=kv_lens, kv_slots=kv_slots,
    )
    if decode_rows:
        lens = torch.tensor([len(s) for s in decode_slots])
        padded = torch.zeros(len(decode_slots), int(lens.max()), dtype=torch.long)  # [B, L_max], pad slot 0
        for i, s in enumerate(decode_slots):
            padded[i, : len(s)] = s
        meta.decode_rows = torch.tensor(decode_rows, device=device)
        meta.decode_kv_slots = padded.to(device)
        meta.decode_mask = (torch.arange(padded.shape[1])[None, :] < lens[:, None]).to(device)  # [B, L_max]
    return meta


def contiguous_table(first_block: int, num_tokens: int, block_size: int) -> list[int]:
    """Block table of a sequence stored in consecutive blocks from ``first_block``."""
    return list(range(first_block, first_block + -(-num_tokens // block_size)))
