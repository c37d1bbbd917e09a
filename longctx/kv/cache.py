"""The paged KV cache tensors and the per-step attention metadata (torch).

For each layer the pool stores K and V as ``[num_blocks, block_size, num_kv_heads, head_dim]``; viewed flat,
``[num_slots, num_kv_heads, head_dim]`` with ``slot = block * block_size + offset``
(``longctx.kv.block_manager.slots``, the one slot formula). New keys/values are *written* at their slots;
attention *gathers* a sequence's keys back through its block table: K/V of a sequence need not be contiguous
in memory (PagedAttention).
A pool may store them in fewer bytes than the model computes in (``kv_dtype``: FP8, INT8, INT4 with scales,
``longctx.kv.quant``): they are quantized as they are written and dequantized as they are read.
"""

from __future__ import annotations

import torch

from longctx.kv.quant import dequantize, get_format, quantize

# the per-step metadata lives in longctx.kv.step_metadata; these names stay importable from here
from longctx.kv.step_metadata import (  # noqa: F401
    AttentionMetadata,
    ChunkSlots,
    DecodeGroup,
    build_attention_metadata,
)

_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class PagedKVCache:
    """K and V for every layer: ``k[layer]``, ``v[layer]`` hold ``[num_blocks, block_size, H_kv, d_head]``
    numbers.

    ``kv_dtype`` (``longctx.kv.quant``: fp32, fp16, bf16, fp8, int8, int4; None = the model's ``dtype``)
    is how the pool stores them. When it is the model's dtype, ``flat`` returns plain tensor views (no copy);
    otherwise each layer's K and V are :class:`EncodedKV` objects that convert on write and on read, and
    ``data`` holds the codes (uint8 for the quantized formats) with ``scales`` beside them: the pool really
    holds the smaller tensors (``nbytes``).

    A hybrid model's pool (``longctx.kv.hybrid``) has one layer axis entry per layer of a KV-cache group,
    not per layer: ``layer_slot[layer]`` says which entry a layer uses, and which blocks are its own comes
    from its group's block tables. ``num_layers`` is then the group size.
    """

    def __init__(
        self, num_layers, num_blocks, block_size, num_kv_heads, head_dim, device="cpu", dtype=torch.float32,
        kv_dtype: str | None = None, layer_slot: list[int] | None = None,
    ):
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        self.layer_slot = layer_slot
        fmt = None if kv_dtype is None else get_format(kv_dtype)
        if fmt is not None and not fmt.quantized and _TORCH_DTYPES[fmt.name] == dtype:
            fmt = None  # the model's own dtype: store plainly
        self.format = fmt
        self.kv_dtype = fmt.name if fmt is not None else next(
            (n for n, t in _TORCH_DTYPES.items() if t == dtype), str(dtype))
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads)
        self.scales = None
        if fmt is None:
            self.data = torch.zeros((*shape, head_dim), device=device, dtype=dtype)
        elif not fmt.quantized:
            self.data = torch.zeros((*shape, head_dim), device=device, dtype=_TORCH_DTYPES[fmt.name])
        else:
            self.data = torch.zeros((*shape, fmt.code_bytes(head_dim)), device=device, dtype=torch.uint8)
            self.scales = torch.zeros((*shape, fmt.groups(head_dim)), device=device, dtype=torch.float16)

    @classmethod
    def for_model(cls, config, num_blocks: int, block_size: int = 16, device="cpu", dtype=torch.float32,
                  kv_dtype: str | None = None):
        return cls(config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim, device,
                   dtype, kv_dtype)

    @classmethod
    def for_pool(cls, config, block_manager, device="cpu", dtype=torch.float32, kv_dtype: str | None = None):
        """The tensors of the pool ``block_manager`` describes (its ``num_blocks`` x ``block_size``; for a
        ``HybridBlockManager``, one layer entry per layer of a group)."""
        groups = getattr(block_manager, "groups", None)
        if groups is None:
            return cls.for_model(config, block_manager.num_blocks, block_manager.block_size, device, dtype,
                                 kv_dtype)
        return cls(len(groups[0].layers), block_manager.num_blocks, block_manager.block_size,
                   config.num_kv_heads, config.head_dim, device, dtype, kv_dtype, block_manager.layer_slot())

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        """Bytes the pool's tensors hold (codes and scales)."""
        n = self.data.numel() * self.data.element_size()
        return n if self.scales is None else n + self.scales.numel() * self.scales.element_size()

    @property
    def bytes_per_token(self) -> int:
        """``nbytes`` per token slot: what ``longctx.kv.quant.pool_bytes_per_token`` predicts."""
        return self.nbytes // (self.num_blocks * self.block_size)

    def flat(self, layer: int):
        """K and V of ``layer`` as ``[num_slots, H_kv, d_head]``: tensor views, or :class:`EncodedKV`."""
        if self.layer_slot is not None:
            layer = self.layer_slot[layer]
        k, v = self.data[layer]  # each [num_blocks, block_size, H_kv, d or code bytes]
        if self.format is None:
            return k.flatten(0, 1), v.flatten(0, 1)  # [num_blocks * block_size, H_kv, d]
        if self.scales is None:
            return EncodedKV(k.flatten(0, 1), None, self.format, self.dtype), EncodedKV(
                v.flatten(0, 1), None, self.format, self.dtype)
        ks, vs = self.scales[layer]  # (layer: already its slot)
        return (EncodedKV(k.flatten(0, 1), ks.flatten(0, 1), self.format, self.dtype),
                EncodedKV(v.flatten(0, 1), vs.flatten(0, 1), self.format, self.dtype))


class EncodedKV:
    """One layer's K (or V) stored in another format, indexed like a ``[num_slots, H_kv, d]`` tensor:
    ``x[slots] = values`` encodes (quantizes, or casts), ``x[slots]`` decodes to the model's dtype.
    Attention, KV pruning and the decode gather use it exactly as they use a tensor."""

    def __init__(self, codes, scales, fmt, dtype):
        self.codes, self.scales, self.format, self.dtype = codes, scales, fmt, dtype

    def __getitem__(self, index) -> torch.Tensor:
        if self.scales is None:
            return self.codes[index].to(self.dtype)
        return dequantize(self.codes[index], self.scales[index], self.format, self.dtype)

    def __setitem__(self, index, values: torch.Tensor) -> None:
        if self.scales is None:
            self.codes[index] = values.to(self.codes.dtype)
            return
        self.codes[index], self.scales[index] = quantize(values, self.format)

    def select_blocks(self, kv_blocks: torch.Tensor, block_size: int) -> torch.Tensor:
        """Whole blocks ``kv_blocks`` [n], decoded: ``[n, block_size, H_kv, d]``."""
        codes = self.codes.view(-1, block_size, *self.codes.shape[1:]).index_select(0, kv_blocks)
        if self.scales is None:
            return codes.to(self.dtype)
        scales = self.scales.view(-1, block_size, *self.scales.shape[1:]).index_select(0, kv_blocks)
        return dequantize(codes, scales, self.format, self.dtype)
