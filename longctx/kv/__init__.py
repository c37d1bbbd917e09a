"""The paged KV cache.

- `block_manager` (pure Python): which fixed-size blocks of the pool each sequence owns, block tables
  and slot mapping. The scheduler consults it; it never touches tensors.
- `cache` (torch): the K and V tensors of the pool, one pair per layer, written through the slot mapping.

Nothing here is imported at package import time: ``import longctx.kv`` stays torch-free.
"""
