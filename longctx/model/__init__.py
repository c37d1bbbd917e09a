"""The real models: SmolLM2-135M-Instruct (a Llama, the default) and Gemma 3 270M, from GGUFs shipped in
wheels (``registry``), or any Llama / Gemma 3 GGUF given by its path.

The model's shape is a ``longctx.specs.ModelSpec`` (the same type the calculators and the simulator use).

- ``config``: a spec from GGUF metadata, ``check_runnable``, a spec as a plain dict (pure Python).
- ``registry``: the course's models by name (where each file comes from, its licence) or a .gguf path.
- ``gguf``: read a GGUF: dequantize its tensors, its config by architecture, rebuild its tokenizer files.
- ``weights``: the cache: dequantize once, store as safetensors in ``$LONGCTX_CACHE_DIR`` (default
  ``~/.cache/longctx``), load it back in about a second.
- ``tokenizer``: the cached tokenizer (SmolLM2's byte-level BPE, Gemma's SentencePiece BPE); chat templates.
- ``llama``: our own Llama forward pass over a paged KV cache (torch).
- ``gemma3``: our own Gemma 3 forward pass (sliding-window and global layers) over the same cache.

Importing this package imports nothing heavy; the submodules import what they need.
"""
