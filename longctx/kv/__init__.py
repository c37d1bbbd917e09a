"""The paged KV cache.

- `block_manager` (pure Python): which fixed-size blocks of the pool each sequence owns, block tables
  and slot mapping. The scheduler consults it; it never touches tensors.
- `hybrid` (pure Python): the pool of a model with sliding-window layers (Gemma 3) as vLLM's hybrid KV-cache
  manager keeps it: KV-cache groups with their own block tables over one free list, the sliding groups
  giving back the blocks their window has passed; `block_manager_for` picks the pool a model needs.
- `cache` (torch): the K and V tensors of the pool, one pair per layer (per layer of a group in a hybrid
  pool), written through the slot mapping.

Nothing here is imported at package import time: ``import longctx.kv`` stays torch-free.
"""
