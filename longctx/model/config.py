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
                       source: str = "GGUF metadata") -> ModelSpec:
    """A ``ModelSpec`` from llama.cpp's ``llama.*`` metadata keys."""
    num_heads = int(meta["llama.attention.head_count"])
    d_model = int(meta["llama.embedding_length"])
    return ModelSpec(
        name=name,
        num_layers=int(meta["llama.block_count"]),
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
        head_dim=int(meta.get("llama.rope.dimension_count", d_model // num_heads)),
        source=source,
        intermediate_size=int(meta["llama.feed_forward_length"]),
        vocab_size=int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        max_context=int(meta["llama.context_length"]),
        tie_embeddings=not has_output_weight,
        rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
    )


def resized(spec: ModelSpec, **changes) -> ModelSpec:
    """``spec`` with some shapes changed (``num_layers=2``); ``num_params`` is recounted when it was
    counted from the shapes (``dataclasses.replace`` would keep the old count)."""
    if spec.params_from_shapes and "num_params" not in changes:
        changes["num_params"] = None
    return dataclasses.replace(spec, **changes)


# SmolLM2-135M-Instruct as its GGUF metadata states it (tests/test_model.py checks the shapes agree):
# the registry's spec with the epsilon stored in the GGUF (1e-5 as float32).
SMOLLM2_135M = resized(get_model("smollm2-135m"), rms_norm_eps=9.999999747378752e-06)

# Llama-3-8B's shape (the registry's spec), for random-weight speed and memory experiments on a GPU.
LLAMA3_8B = get_model("llama-3-8b")
