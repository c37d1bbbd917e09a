"""What the GPU suite runs: random-weight Llama models at real shapes, their KV caches and attention
metadata, and the FLOPs and bytes each measured step really executes (for achieved TFLOP/s and TB/s).

Shapes: ``LLAMA3_8B`` (Meta's config) whole, and a Llama-3.1-70B-shaped *slice* (its real layer shape,
a few layers: the 80-layer model's 141 GB of bf16 weights do not fit one GPU beside a KV cache).
"""

from __future__ import annotations

import contextlib

from longctx.kv.cache import AttentionMetadata, build_attention_metadata
from longctx.model import llama as llama_module
from longctx.model.config import LLAMA3_8B, resized
from longctx.specs import ModelSpec, get_model

# Llama-3.1-70B's layer shape (Meta's config.json; longctx.specs "llama-3.1-70b"), as a few-layer slice.
LLAMA31_70B = get_model("llama-3.1-70b")

# Tiny shapes for the CPU toy run (seconds end to end); same code paths as the real ones.
TOY = ModelSpec("toy", 2, 64, 4, 2, 16, "tiny random-weight stand-in for the CPU toy run",
                intermediate_size=160, vocab_size=512, rope_theta=10000.0, max_context=1 << 16)
TOY_WIDE = resized(TOY, name="toy-wide", d_model=128, num_heads=8, head_dim=16, intermediate_size=320,
                   num_layers=1)


def model_configs(toy: bool, slice_layers: int = 4, main_layers: int | None = None) -> dict[str, ModelSpec]:
    """Name -> config: ``llama-3-8b`` and ``llama-3.1-70b-slice`` (``toy``: tiny stand-ins, same names).
    ``main_layers`` keeps only that many of Llama-3-8B's 32 layers (quick live measurements in lessons)."""
    if toy:
        return {"llama-3-8b": TOY, "llama-3.1-70b-slice": TOY_WIDE}
    main = resized(LLAMA3_8B, max_context=1 << 17)
    return {"llama-3-8b": main if main_layers is None else resized(main, num_layers=main_layers),
            "llama-3.1-70b-slice": resized(LLAMA31_70B, num_layers=slice_layers)}


def build_model(config: ModelSpec, device, dtype, seed: int = 0):
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


# ---- attention metadata ------------------------------------------------------------------------------


def fast_metadata(chunks, block_size: int, device="cpu") -> AttentionMetadata:
    """The engine's own builder (``longctx.kv.cache.build_attention_metadata``, vectorised per sequence with
    decodes grouped by context length), so the GPU measures exactly the engine's attention path.
    ``chunks`` is ``(block_table, num_computed, num_new)`` per sequence."""
    return build_attention_metadata(chunks, block_size, device)


def contiguous_table(first_block: int, num_tokens: int, block_size: int) -> list[int]:
    """Block table of a sequence stored in consecutive blocks from ``first_block``."""
    return list(range(first_block, first_block + -(-num_tokens // block_size)))
