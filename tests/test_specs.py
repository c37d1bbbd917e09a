"""Specs: registry numbers match the published configs; validation says what is allowed."""

import dataclasses

import pytest

from longctx.specs import (
    DTYPE_BYTES,
    HARDWARE,
    MODELS,
    HardwareSpec,
    ModelSpec,
    dtype_bytes,
    get_hardware,
    get_model,
    param_count_from_shapes,
)


@pytest.mark.parametrize(
    "name, expected, rel",
    [
        ("llama-2-7b", 6.74e9, 1e-3), ("llama-3-8b", 8.03e9, 1e-3), ("llama-3.1-70b", 70.6e9, 1e-3),
        ("mistral-7b", 7.24e9, 1e-3), ("smollm2-135m", 134.5e6, 1e-3), ("teaching-7b-mha", 7e9, 0),
    ],
)
def test_param_counts_match_published(name, expected, rel):
    assert get_model(name).num_params == pytest.approx(expected, rel=rel)


def test_exact_counts_from_shapes():
    # HF safetensors totals: Llama-3-8B 8,030,261,248; SmolLM2-135M 134,515,008 (tied embeddings)
    assert get_model("llama-3-8b").num_params == 8_030_261_248
    assert get_model("smollm2-135m").num_params == 134_515_008
    assert get_model("llama-2-7b").num_params == 6_738_415_616


@pytest.mark.parametrize(
    "name, L, hq, hkv, dh, dm",
    [
        ("llama-2-7b", 32, 32, 32, 128, 4096), ("llama-3-8b", 32, 32, 8, 128, 4096),
        ("llama-3.1-70b", 80, 64, 8, 128, 8192), ("mistral-7b", 32, 32, 8, 128, 4096),
        ("smollm2-135m", 30, 9, 3, 64, 576), ("teaching-7b-mha", 32, 32, 32, 128, 4096),
    ],
)
def test_shapes(name, L, hq, hkv, dh, dm):
    m = get_model(name)
    assert (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.d_model) == (L, hq, hkv, dh, dm)
    assert m.d_attn == hq * dh
    assert m.source


def test_smollm2_details():
    m = get_model("smollm2-135m")
    assert (m.intermediate_size, m.vocab_size, m.rope_theta, m.max_context, m.tie_embeddings) == (
        1536, 49152, 100000.0, 8192, True)


def test_every_spec_has_a_source():
    assert all(m.source for m in MODELS.values())
    assert all(h.source for h in HARDWARE.values())


def test_hardware_numbers():
    assert get_hardware("h100").peak_flops_per_s == 989e12
    assert get_hardware("h100").memory_bandwidth_bytes_per_s == 3.35e12
    assert get_hardware("a100").peak_flops_per_s == 312e12
    assert get_hardware("a100").memory_bandwidth_bytes_per_s == 2.039e12
    assert get_hardware("h200").memory_bandwidth_bytes_per_s == 4.8e12
    assert get_hardware("h200").memory_bytes == 141e9
    assert get_hardware("h100").ridge_flops_per_byte == pytest.approx(295.2, abs=0.1)


def test_dtype_bytes():
    assert DTYPE_BYTES == {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
    assert dtype_bytes("FP16") == 2


@pytest.mark.parametrize("fn, bad", [(get_model, "gpt-5"), (get_hardware, "tpu"), (dtype_bytes, "fp7")])
def test_unknown_names_list_allowed(fn, bad):
    with pytest.raises(ValueError, match="allowed"):
        fn(bad)


def test_lookup_passes_specs_through():
    m = get_model("llama-3-8b")
    assert get_model(m) is m


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_model("llama-3-8b").num_layers = 3


def test_validation_messages():
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        ModelSpec("x", 0, 64, 2, 2, 32, "src", num_params=10)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelSpec("x", 2, 64, 3, 2, 32, "src", num_params=10)
    with pytest.raises(ValueError, match="source"):
        ModelSpec("x", 2, 64, 2, 2, 32, "", num_params=10)
    with pytest.raises(ValueError, match="give num_params"):
        ModelSpec("x", 2, 64, 2, 2, 32, "src")
    with pytest.raises(ValueError, match="memory_bandwidth_bytes_per_s must be a positive"):
        HardwareSpec("x", 1e12, 0, 1e9, "src")


def test_param_count_needs_shapes():
    with pytest.raises(ValueError, match="vocab_size"):
        param_count_from_shapes(get_model("teaching-7b-mha"))


def test_usable_capacity_beside_the_datasheet():
    # what the runtime reports (nvidia-smi memory.total, MiB), not the datasheet's "GB" (issue 12, item 1)
    expected_mib = {"h100": 81_559, "h200": 143_771, "a100": 81_920}
    for name, mib in expected_mib.items():
        hw = get_hardware(name)
        assert hw.usable_memory_bytes == mib * 2**20
        assert f"{mib}MiB" in hw.usable_memory_source and "nvidia-smi" in hw.usable_memory_source
    h100 = get_hardware("h100")
    assert h100.memory_bytes == 80e9  # the datasheet's 80 GB, read as decimal
    assert h100.usable_memory_bytes / 2**30 == pytest.approx(79.65, abs=0.01)  # GiB: not 74.5
    assert h100.usable_memory_bytes > h100.memory_bytes  # HBM is binary: "80GB" holds more than 80e9 bytes
    assert get_hardware("a100").usable_memory_bytes == 80 * 2**30


def test_usable_capacity_needs_a_source():
    with pytest.raises(ValueError, match="usable_memory_source"):
        HardwareSpec("x", 1e12, 1e12, 1e9, "datasheet", usable_memory_bytes=1e9)
    with pytest.raises(ValueError, match="usable_memory_bytes"):
        HardwareSpec("x", 1e12, 1e12, 1e9, "datasheet", usable_memory_bytes=-1.0, usable_memory_source="smi")
