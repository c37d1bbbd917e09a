"""Shared, cached loaders for the tests that need a real model (SmolLM2, and Gemma 3 270M, from their
installed GGUFs), and transformers' reading of the same files (the reference)."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shutil
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
def gemma_model():
    from longctx.model.weights import load_model

    return load_model(model="gemma3-270m")


@functools.lru_cache(maxsize=1)
def gemma_tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer("gemma3-270m")


@functools.lru_cache(maxsize=1)
def gemma_reference():
    """(transformers Gemma3ForCausalLM, tokenizer) from the Gemma 3 GGUF, once per process."""
    from transformers import AutoTokenizer

    return hf_model(model="gemma3-270m"), AutoTokenizer.from_pretrained(reference_folder("gemma3-270m"))


@functools.lru_cache(maxsize=1)
def hf_reference():
    """(transformers LlamaForCausalLM, tokenizer) loaded from the same GGUF, once per session (`hf_model`)."""
    from transformers import AutoTokenizer

    folder = reference_folder()
    return hf_model(), AutoTokenizer.from_pretrained(folder)


def hf_model(model: str = "smollm2-135m", **options):
    """transformers' model in fp32 as transformers itself reads the GGUF (its dequantization):
    ``LlamaForCausalLM`` for SmolLM2, ``Gemma3ForCausalLM`` for Gemma 3.

    Dequantizing takes ~20 s on two busy cores, and four test modules on two workers need it: the first
    caller saves transformers' result (safetensors, config, tokenizer) under the course's cache, keyed by
    the GGUF file's digest and the transformers version, and every later load (this session's other
    worker, later runs) reads that copy, the same tensors bit for bit (a file lock makes the second worker
    wait, not redo it)."""
    import torch

    folder = reference_folder(model)
    if not (folder / "model.safetensors").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "model.safetensors").is_file():
                _save_reference(folder, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _hf_class(model).from_pretrained(folder, dtype=torch.float32, **options).eval()


def _hf_class(model: str):
    from transformers import Gemma3ForCausalLM, LlamaForCausalLM

    return Gemma3ForCausalLM if model == "gemma3-270m" else LlamaForCausalLM


@functools.lru_cache(maxsize=2)
def reference_folder(model: str = "smollm2-135m"):
    """Where transformers' dequantized copy lives (the GGUF's digest read once per process)."""
    import transformers

    from longctx.model.weights import cache_dir, find_gguf

    with open(find_gguf(model), "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()[:16]
    return cache_dir() / f"transformers-reference-{digest}-{transformers.__version__}"


def _save_reference(folder, model: str = "smollm2-135m") -> None:
    """transformers' model and tokenizer from the GGUF, written to `folder` (atomically: a rename)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from longctx.model.weights import find_gguf

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    path = find_gguf(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = _hf_class(model).from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config   # the tensors are plain fp32 now (GGUF's quantizer cannot save them)
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (config.tie_word_embeddings and k == "lm_head.weight")}   # tied: stored once
    scratch = folder.parent / f"{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    config.save_pretrained(scratch)
    tok.save_pretrained(scratch)
    save_file(state, scratch / "model.safetensors", metadata={"format": "pt"})
    os.replace(scratch, folder)


PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, 3 astronauts flew to the Moon; 2 of them walked on it. Why does it matter?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # prints",
]
