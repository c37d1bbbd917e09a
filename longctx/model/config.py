"""``LlamaConfig``: the shape of a Llama-family model. Pure Python, so calculators can use it too."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LlamaConfig:
    """Shapes and constants of a Llama decoder (names follow the lessons, not transformers).

    ``d_model`` = ``num_heads * head_dim`` need not hold (it does for the models here); GQA needs
    ``num_heads`` to be a multiple of ``num_kv_heads``.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_model_len: int = 2048
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "d_model",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "ffn_dim",
        ):
            value = getattr(self, name)
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be > 0")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        return cls(**d)

    @classmethod
    def from_gguf_metadata(cls, meta: dict, has_output_weight: bool) -> LlamaConfig:
        """From llama.cpp's ``llama.*`` metadata keys."""
        num_heads = int(meta["llama.attention.head_count"])
        d_model = int(meta["llama.embedding_length"])
        return cls(
            vocab_size=int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", ())))),
            d_model=d_model,
            num_layers=int(meta["llama.block_count"]),
            num_heads=num_heads,
            num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
            head_dim=int(meta.get("llama.rope.dimension_count", d_model // num_heads)),
            ffn_dim=int(meta["llama.feed_forward_length"]),
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            max_model_len=int(meta["llama.context_length"]),
            tie_embeddings=not has_output_weight,
        )


# SmolLM2-135M-Instruct, as its GGUF metadata states (checked by tests/test_model.py).
SMOLLM2_135M = LlamaConfig(
    vocab_size=49152,
    d_model=576,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    ffn_dim=1536,
    rope_theta=100000.0,
    rms_norm_eps=9.999999747378752e-06,  # 1e-5 as the GGUF stores it (float32)
    max_model_len=8192,
    tie_embeddings=True,
)

# Llama-3-8B's shape (Meta's config.json), for random-weight speed and memory experiments on a GPU.
LLAMA3_8B = LlamaConfig(
    vocab_size=128256,
    d_model=4096,
    num_layers=32,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    ffn_dim=14336,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    max_model_len=8192,
    tie_embeddings=False,
)
