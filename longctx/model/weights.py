"""A model's weights: dequantize its GGUF once (``longctx.model.gguf``), cache, load fast.

``fetch_model(model=...)`` (default SmolLM2; ``longctx.model.registry`` names the others) dequantizes the
model's GGUF to float32 and writes, in ``cache_dir()/<cache name>-v2/`` (``smollm2-135m-instruct-v2``,
``gemma3-270m-v2``; the suffix is ``CACHE_FORMAT``):

- ``model.safetensors`` (our parameter names; Llama's Q/K rows un-permuted back to rotate-half RoPE order),
  and ``model.bf16.safetensors``, the same in bfloat16 (what a bf16 load reads),
- ``config.json`` (the ``ModelSpec``), ``tokenizer.json`` (a ``tokenizers`` BPE), ``tokenizer_meta.json``
  (special tokens, BOS rule and the chat template).

``load_model(model=...)`` reads them back in a second or two and builds the decoder the file's architecture
names (``longctx.model.llama.Llama`` or ``longctx.model.gemma3.Gemma3``). Nothing is downloaded, ever.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from longctx.model.config import check_runnable, spec_from_dict, spec_to_dict
from longctx.model.gguf import build_tokenizer_files, convert_tensors, find_gguf, model_spec, read_gguf
from longctx.model.registry import ModelSource, resolve_model
from longctx.specs import ModelSpec

__all__ = ["cache_dir", "fetch_model", "find_gguf", "is_cached", "load_config", "load_model",
           "load_state_dict", "model_dir"]

CACHE_ENV_VAR = "LONGCTX_CACHE_DIR"
CACHE_FORMAT = 2  # bump when the cached files change meaning (2: config as a ModelSpec)
CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_meta.json")
BF16_FILE = "model.bf16.safetensors"  # written by fetch_model since the Gemma release; older caches lack it


def cache_dir() -> Path:
    """``$LONGCTX_CACHE_DIR``, or ``~/.cache/longctx``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longctx"


def model_dir(model: str | ModelSource | None = None) -> Path:
    """``model``'s cache folder in this cache format (an older format's folder is left alone for older
    code)."""
    return cache_dir() / f"{resolve_model(model).cache_name}-v{CACHE_FORMAT}"


def is_cached(directory: Path | None = None) -> bool:
    d = directory or model_dir()
    try:
        stamp = json.loads((d / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("cache_format") == CACHE_FORMAT and all((d / f).is_file() for f in CACHE_FILES)


def fetch_model(force: bool = False, model: str | ModelSource | None = None) -> Path:
    """Dequantize ``model``'s GGUF into the cache, unless it is already there. Returns the model directory.

    Idempotent; writes into a temporary folder then renames it, so a killed run leaves no half cache.
    """
    source = resolve_model(model)
    target = model_dir(source)
    if is_cached(target) and not force:
        return target
    import numpy as np
    from safetensors.numpy import save_file

    gguf_path = source.locate()
    meta, tensors = read_gguf(gguf_path)
    where = f"the {source.distribution} wheel" if source.distribution else str(gguf_path.parent)
    config = model_spec(meta, tensors, name=source.name, source=f"metadata of {gguf_path.name} in {where}")
    params = {k: np.ascontiguousarray(v) for k, v in convert_tensors(tensors, config).items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        save_file(params, str(tmp / "model.safetensors"))
        _save_bf16(params, tmp / BF16_FILE)
        build_tokenizer_files(meta, tmp)
        stamp = {"cache_format": CACHE_FORMAT, "source": str(gguf_path), "licence": source.licence,
                 "config": spec_to_dict(config)}
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


def _save_bf16(params: dict, path: Path) -> None:
    """A bfloat16 copy beside the float32 one: loading a model in bf16 then reads half the bytes and converts
    nothing (Gemma 3 at 8K in bf16 stays under Binder's memory; float32 -> bf16 as torch rounds it)."""
    import torch
    from safetensors.torch import save_file

    save_file({k: torch.tensor(v, dtype=torch.bfloat16) for k, v in params.items()}, str(path))  # (copies)


def load_config(directory: Path | None = None) -> ModelSpec:
    """The cached model's ``ModelSpec`` (fetching the model first if needed)."""
    d = fetch_model() if directory is None else directory
    return check_runnable(spec_from_dict(json.loads((d / "config.json").read_text())["config"]))


def load_state_dict(directory: Path | None = None, device="cpu", dtype=None) -> dict:
    """The cached parameters as torch tensors (fetching the model first if needed), each converted to
    ``dtype`` as it is read: the float32 copy of one tensor at a time, never of the whole model (Gemma's
    embedding alone is 671 MB in float32)."""
    import torch
    from safetensors import safe_open

    d = fetch_model() if directory is None else directory
    sd, name = {}, "model.safetensors"
    if dtype is torch.bfloat16 and (d / BF16_FILE).is_file():
        name = BF16_FILE  # the same rounding, done once at fetch time
    with safe_open(str(d / name), framework="pt", device=str(device)) as f:
        for name in f.keys():  # noqa: SIM118 (safe_open has keys(), not iteration)
            t = f.get_tensor(name)
            sd[name] = t if dtype is None else t.to(dtype)
            del t
    return sd


def build_model(config: ModelSpec, device=None, dtype=None, attention_backend: str = "auto"):
    """The decoder ``config.architecture`` names, with uninitialised weights (``meta`` device: none)."""
    if config.architecture == "gemma3":
        from longctx.model.gemma3 import Gemma3

        return Gemma3(config, device=device, dtype=dtype, attention_backend=attention_backend)
    from longctx.model.llama import Llama

    return Llama(config, device=device, dtype=dtype, attention_backend=attention_backend)


def load_model(device="cpu", dtype=None, attention_backend: str = "auto", model: str | None = None):
    """``model`` (default SmolLM2-135M-Instruct; ``longctx.model.registry.resolve_model``) in eval mode on
    ``device`` (``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``; CUDA absent is a one-line
    ``ValueError``); ``dtype``: a ``torch.dtype``, a ``--dtype`` name (``auto``: fp32 on a CPU, bf16 on CUDA)
    or None for float32; ``attention_backend``: ``longctx.model.attention.choose_backend`` (an engine
    re-chooses it per pool)."""
    import torch

    from longctx.model.attention import choose_backend
    from longctx.model.device import resolve_device, resolve_dtype

    device = resolve_device(str(device))
    d = fetch_model(model=model)
    dtype = resolve_dtype(dtype, device) if isinstance(dtype, str) else dtype or torch.float32
    config = load_config(d)
    net = build_model(config, device="meta", dtype=dtype)
    net.load_state_dict(load_state_dict(d, device=device, dtype=dtype), assign=True)
    net.attention_backend = choose_backend(attention_backend, device, dtype, sliding_window=config.is_hybrid)
    return net.eval()
