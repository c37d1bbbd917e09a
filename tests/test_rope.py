"""RoPE extensions (longctx.model.rope) against transformers' own implementations, and in the model."""

import math

import pytest
import torch

from longctx.model.rope import (
    correction_index,
    default_inv_freq,
    rope_parameters,
    validate_scaling,
    yarn_ramp,
    yarn_ramp_paper,
)

SHAPES = [(64, 100000.0, 8192), (128, 500000.0, 8192), (64, 10000.0, 2048), (96, 1e6, 4096)]


def _hf(head_dim, theta, L, scaling, seq_len=None):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**scaling, "rope_theta": theta}
    if scaling["rope_type"] == "dynamic":  # transformers reads the training length from the config here
        params.pop("original_max_position_embeddings", None)
    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                      max_position_embeddings=L, rope_parameters=params)
    return ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu", seq_len)


@pytest.mark.parametrize("head_dim,theta,L", SHAPES)
@pytest.mark.parametrize(
    "scaling,seq_len",
    [
        ({"rope_type": "linear", "factor": 2.0}, None), ({"rope_type": "linear", "factor": 8.0}, None),
        ({"rope_type": "dynamic", "factor": 2.0}, None), ({"rope_type": "dynamic", "factor": 2.0}, 3 * 8192),
        ({"rope_type": "dynamic", "factor": 4.0}, 12000), ({"rope_type": "yarn", "factor": 2.0}, None),
        ({"rope_type": "yarn", "factor": 16.0}, None),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": 16, "beta_slow": 2}, None),
        ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3}, None),
        ({"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 0.707}, None),
        ({"rope_type": "yarn", "factor": 3.0, "truncate": False}, None),
    ],
)
def test_matches_transformers(head_dim, theta, L, scaling, seq_len):
    scaling = {**scaling, "original_max_position_embeddings": L}
    ref_inv, ref_factor = _hf(head_dim, theta, L, scaling, seq_len)
    inv, factor = rope_parameters(head_dim, theta, scaling, seq_len=seq_len)
    assert inv.shape == (head_dim // 2,) and inv.dtype == torch.float32
    torch.testing.assert_close(inv, ref_inv.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)


def test_plain_rope_is_the_default_formula():
    inv, factor = rope_parameters(64, 1e5)
    assert factor == 1.0
    expected = torch.tensor([1e5 ** (-2 * i / 64) for i in range(32)])
    torch.testing.assert_close(inv, expected, rtol=1e-6, atol=0)
    assert torch.equal(rope_parameters(64, 1e5, {"rope_type": "default"})[0], inv)


@pytest.mark.parametrize("d,theta,s", [(64, 1e5, 2.0), (128, 5e5, 4.0), (32, 1e4, 8.0)])
def test_ntk_raises_the_base_fastest_pair_kept_slowest_divided_by_s(d, theta, s):
    inv, factor = rope_parameters(d, theta, {"rope_type": "ntk", "factor": s})
    base = default_inv_freq(d, theta)
    assert factor == 1.0
    assert inv[0] == 1.0
    assert float(inv[-1]) == pytest.approx(float(base[-1]) / s, rel=1e-5)
    assert torch.all(inv <= base)  # a larger base: every pair slower or equal, never faster
    torch.testing.assert_close(inv, default_inv_freq(d, theta * s ** (d / (d - 2))))


def test_yarn_is_not_a_base_scaled_by_a_tenth():
    """The source's claim (YaRN scales the base by 0.1x or 0.01x) describes neither YaRN nor NTK."""
    d, theta, L, s = 64, 1e5, 8192, 2.0
    yarn, _ = rope_parameters(
        d, theta, {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L}
    )
    base = default_inv_freq(d, theta)
    for k in (0.1, 0.01):
        shrunk = default_inv_freq(d, theta * k)
        assert torch.all(shrunk[1:] > base[1:])  # a smaller base makes every pair FASTER: more extrapolation
        assert not torch.allclose(yarn, shrunk, rtol=0.05)
    ratio = yarn / base  # YaRN: 1 for fast pairs, 1/s for slow ones, in between on the ramp
    assert ratio[0] == 1 and ratio[-1] == pytest.approx(1 / s)
    assert torch.all(ratio <= 1 + 1e-7) and torch.all(ratio >= 1 / s - 1e-7)


def test_code_ramp_and_paper_ramp_agree_at_the_ends_and_differ_in_the_band():
    d, theta, L = 64, 1e5, 8192
    code, paper = yarn_ramp(d, theta, L), yarn_ramp_paper(d, theta, L)
    lo, hi = correction_index(32, d, theta, L), correction_index(1, d, theta, L)
    assert math.floor(lo) < math.ceil(hi) < d // 2
    assert code[0] == 0 and paper[0] == 0 and code[-1] == 1 and paper[-1] == 1
    gap = (code - paper).abs().max().item()
    assert 0.3 < gap < 0.8  # linear in the index vs linear in r = L / wavelength
    r = L / (2 * math.pi / default_inv_freq(d, theta).double())
    inside = (r > 1) & (r < 32)
    torch.testing.assert_close(paper[inside].double(), 1 - (r[inside] - 1) / 31, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "scaling,match",
    [
        ({"rope_type": "magic", "factor": 2}, "rope_type must be one of"),
        ({"rope_type": "linear", "factor": 0.5}, "factor"),
        ({"rope_type": "linear"}, "factor"),
        ({"rope_type": "yarn", "factor": 2.0}, "original_max_position_embeddings"),
        ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192, "beta_fast": 1,
          "beta_slow": 4}, "beta_fast > beta_slow"),
        ("yarn", "must be a dict"),
    ],
)
def test_bad_scaling_is_a_clear_error(scaling, match):
    with pytest.raises(ValueError, match=match):
        rope_parameters(64, 1e5, scaling)


def test_bad_shapes_and_the_legacy_type_key():
    with pytest.raises(ValueError, match="head_dim"):
        rope_parameters(63, 1e5)
    with pytest.raises(ValueError, match="theta"):
        rope_parameters(64, 0)
    assert validate_scaling({"type": "linear", "factor": 2})["rope_type"] == "linear"


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    ],
)
def test_cos_sin_match_transformers_rotary_embedding(scaling):
    """Our cos/sin (with the attention factor) equal transformers' LlamaRotaryEmbedding's."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from longctx.model.llama import rope_cos_sin

    L = scaling.get("original_max_position_embeddings", 8192)
    params = {**scaling, "rope_theta": 1e5}
    if scaling["rope_type"] == "dynamic":
        params.pop("original_max_position_embeddings")
    cfg = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, max_position_embeddings=L,
                      rope_parameters=params)
    rot = LlamaRotaryEmbedding(cfg)
    pos = torch.arange(0, 200)
    x = torch.zeros(1, 200, 64)
    ref_cos, ref_sin = rot(x, pos[None])
    inv, factor = rope_parameters(64, 1e5, scaling, seq_len=200)
    cos, sin = rope_cos_sin(pos, 64, 1e5, torch.float32, inv, factor)
    torch.testing.assert_close(cos, ref_cos[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin, ref_sin[0], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_model_with_yarn_matches_transformers_with_yarn(hf_reference, smollm2):
    """SmolLM2 with YaRN x2: our logits equal transformers' LlamaForCausalLM given the same
    rope_parameters."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from longctx.engine.exactness import chunked_prefill_logits

    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192}
    hf, _ = hf_reference
    ours = smollm2
    ids = list(range(1000, 1300))
    old_rot = hf.model.rotary_emb
    cfg = hf.config.__class__.from_dict(hf.config.to_dict())
    cfg.rope_parameters = {**scaling, "rope_theta": 100000.0}
    try:
        hf.model.rotary_emb = LlamaRotaryEmbedding(cfg)
        ours.rope_scaling = scaling
        with torch.inference_mode():
            ref = hf(torch.tensor([ids])).logits[0].float()
        got = chunked_prefill_logits(ours, ids, None)
        ours.rope_scaling = None
        plain = chunked_prefill_logits(ours, ids, None)
    finally:
        hf.model.rotary_emb = old_rot
        ours.rope_scaling = None
    assert (got - ref).abs().max() < 1e-3
    assert (plain - ref).abs().max() > 1e-2  # the scaling did change the model
