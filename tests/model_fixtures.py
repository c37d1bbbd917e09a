"""Shared, cached loaders for the tests that need the real model (SmolLM2 from the installed GGUF)."""

from __future__ import annotations

import functools
import os
import warnings


@functools.lru_cache(maxsize=1)
def our_model():
    import torch

    from longctx.model.weights import load_model

    torch.manual_seed(0)
    return load_model()


@functools.lru_cache(maxsize=1)
def our_tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer()


@functools.lru_cache(maxsize=1)
def hf_reference():
    """(transformers LlamaForCausalLM, tokenizer) loaded from the same GGUF: ~25 s, once per session."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from longctx.model.weights import find_gguf

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = find_gguf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tok


PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, 3 astronauts flew to the Moon; 2 of them walked on it. Why does it matter?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # prints",
]
