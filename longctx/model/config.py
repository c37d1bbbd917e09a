"""The shape of a Llama-family model is a ``longctx.specs.ModelSpec`` (one type for calculators, the
simulator and the real model; the registry's names: ``intermediate_size``, ``max_context``, ``gqa_group``).

This module adds what only the real model needs: reading a spec from GGUF metadata, checking that a spec
has every number a forward pass needs, and a spec's plain-dict form (the model cache, GPU records).
Pure Python, so calculators and records can use it without torch.
"""

from __future__ import annotations

import dataclasses

from longctx.specs import ModelSpec, get_model

RUNNABLE_FIELDS = ("intermediate_size", "vocab_size", "rope_theta")


def check_runnable(spec: ModelSpec) -> ModelSpec:
    """``spec`` when it has every shape a forward pass needs; else ``ValueError`` naming what is missing.

    A forward pass also needs ``head_dim`` even (RoPE rotates pairs of dimensions).
    """
    missing = [n for n in RUNNABLE_FIELDS if getattr(spec, n) is None]
    if missing:
        raise ValueError(f"model {spec.name!r} cannot be built: {', '.join(missing)} unknown "
                         f"(give them in its ModelSpec)")
    if spec.head_dim % 2:
        raise ValueError(f"model {spec.name!r}: head_dim must be even for RoPE, got {spec.head_dim}")
    return spec


def spec_to_dict(spec: ModelSpec) -> dict:
    """The constructor arguments of ``spec`` as plain JSON-able data (``spec_from_dict`` reverses it)."""
    d = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
    if spec.params_from_shapes:
        d["num_params"] = None  # recomputed from the shapes
    return d


def spec_from_dict(d: dict) -> ModelSpec:
    """A ``ModelSpec`` from ``spec_to_dict``'s output."""
    names = {f.name for f in dataclasses.fields(ModelSpec) if f.init}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown ModelSpec fields {sorted(unknown)}; allowed: {', '.join(sorted(names))}")
    return ModelSpec(**d)


def from_gguf_metadata(meta: dict, has_output_weight: bool, name: str = "smollm2-135m",
                       source: str = "GGUF metadata", arch: str = "llama") -> ModelSpec:
    """A ``ModelSpec`` from llama.cpp's ``<arch>.*`` metadata keys (``llama`` or ``gemma3``).

    Gemma 3's file states its window (``sliding_window``) but not which layers use it nor the sliding
    layers' RoPE base: those are the architecture's constants (transformers' ``Gemma3TextConfig``: every
    6th layer global, local base 10,000), as is the attention scale ``query_pre_attn_scalar`` = head_dim."""
    def key(k):
        return f"{arch}.{k}"

    num_heads = int(meta[key("attention.head_count")])
    d_model = int(meta[key("embedding_length")])
    head_dim = int(meta.get(key("attention.key_length"), meta.get(key("rope.dimension_count"),
                                                                  d_model // num_heads)))
    shape = dict(
        name=name,
        num_layers=int(meta[key("block_count")]),
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=int(meta.get(key("attention.head_count_kv"), num_heads)),
        head_dim=head_dim,
        source=source,
        intermediate_size=int(meta[key("feed_forward_length")]),
        vocab_size=int(meta.get(key("vocab_size"), len(meta.get("tokenizer.ggml.tokens", ())))),
        rope_theta=float(meta.get(key("rope.freq_base"), 10000.0)),
        max_context=int(meta[key("context_length")]),
        tie_embeddings=not has_output_weight,
        rms_norm_eps=float(meta[key("attention.layer_norm_rms_epsilon")]),
        architecture=arch,
    )
    if arch == "gemma3":
        shape.update(sliding_window=int(meta[key("attention.sliding_window")]), sliding_window_pattern=6,
                     rope_local_theta=10_000.0, norms_per_layer=4, qk_norm=True,
                     query_pre_attn_scalar=float(head_dim))
    return ModelSpec(**shape)


def resized(spec: ModelSpec, **changes) -> ModelSpec:
    """``spec`` with some shapes changed (``num_layers=2``); ``num_params`` is recounted when it was
    counted from the shapes (``dataclasses.replace`` would keep the old count)."""
    if spec.params_from_shapes and "num_params" not in changes:
        changes["num_params"] = None
    return dataclasses.replace(spec, **changes)


# Gemma 3 270M as its GGUF metadata states it (the registry's spec with the file's epsilon, 1e-6 as float32).
GEMMA3_270M = resized(get_model("gemma3-270m"), rms_norm_eps=9.999999974752427e-07)

# SmolLM2-135M-Instruct as its GGUF metadata states it (tests/test_model.py checks the shapes agree):
# the registry's spec with the epsilon stored in the GGUF (1e-5 as float32).
SMOLLM2_135M = resized(get_model("smollm2-135m"), rms_norm_eps=9.999999747378752e-06)

# Llama-3-8B's shape (the registry's spec), for random-weight speed and memory experiments on a GPU.
LLAMA3_8B = get_model("llama-3-8b")
