"""Our Llama, tokenizer and weights against transformers' LlamaForCausalLM loaded from the same GGUF."""

import pytest
import torch
from model_fixtures import PROMPTS

from longctx.model.config import SMOLLM2_135M, check_runnable, spec_from_dict, spec_to_dict
from longctx.model.llama import Llama
from longctx.model.tokenizer import render_chat
from longctx.specs import ModelSpec, get_model

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And at night?"},
    ],
]


def tiny(**kw) -> ModelSpec:
    shape = dict(name="tiny", num_layers=1, d_model=8, num_heads=2, num_kv_heads=1, head_dim=4,
                 source="test", intermediate_size=8, vocab_size=10, rope_theta=10000.0)
    return ModelSpec(**{**shape, **kw})


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tiny(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="head_dim must be even"):
        Llama(tiny(head_dim=3))
    with pytest.raises(ValueError, match="rope_theta unknown"):
        check_runnable(get_model("teaching-7b-mha"))  # the seed's round 7B has no vocabulary or MLP shape
    with pytest.raises(ValueError, match="rms_norm_eps"):
        tiny(rms_norm_eps=0.0)


def test_spec_round_trips_through_a_plain_dict():
    for spec in (SMOLLM2_135M, get_model("llama-3.1-70b"), tiny(num_layers=3)):
        d = spec_to_dict(spec)
        assert spec_from_dict(d) == spec
        assert spec_from_dict({**d, "num_layers": 2}).num_params < spec.num_params  # recounted
    with pytest.raises(ValueError, match="unknown ModelSpec fields"):
        spec_from_dict({**spec_to_dict(SMOLLM2_135M), "ffn_dim": 1536})


def naive_logits(model: Llama, ids: list[int]) -> torch.Tensor:
    """A dense, cache-free forward pass written independently: the reference for the paged one."""
    from longctx.model.llama import apply_rope, rope_cos_sin

    c = model.config
    T = len(ids)
    h = model.embed(torch.tensor(ids))
    cos, sin = rope_cos_sin(torch.arange(T), c.head_dim, c.rope_theta, h.dtype)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for blk in model.layers:
        x = blk.attn_norm(h)
        q = apply_rope(blk.attn.q_proj(x).view(T, c.num_heads, c.head_dim), cos, sin)
        k = apply_rope(blk.attn.k_proj(x).view(T, c.num_kv_heads, c.head_dim), cos, sin)
        v = blk.attn.v_proj(x).view(T, c.num_kv_heads, c.head_dim)
        k = k.repeat_interleave(c.gqa_group, dim=1)
        v = v.repeat_interleave(c.gqa_group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / c.head_dim**0.5
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + blk.attn.o_proj(torch.einsum("hqk,khd->qhd", att, v).reshape(T, -1))
        h = h + blk.mlp(blk.mlp_norm(h))
    return model.norm(h) @ model.output_weight.T


# reference: 40 makes the masked path run in query tiles of a few rows; fused: one call per chunk, paged
# decodes
@pytest.mark.parametrize(("backend", "max_scores"),
                         [("reference", 1 << 24), ("reference", 40), ("fused", 40)])
@pytest.mark.parametrize("consecutive", [False, True])  # True: keys read as a slice of the pool, no gather
def test_paged_forward_matches_naive_attention_on_a_tiny_random_model(monkeypatch, backend, max_scores,
                                                                       consecutive):
    """Shuffled block tables, chunks that straddle blocks, decodes batched with a prefill chunk."""
    from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata
    from longctx.model import attention

    monkeypatch.setattr(attention, "MAX_SCORES_PER_CALL", max_scores)

    cfg = tiny(vocab_size=50, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
               intermediate_size=48)
    model = Llama(cfg, attention_backend=backend).init_random_(seed=1, std=0.2).eval()
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 50, (23,), generator=g).tolist()
    b = torch.randint(0, 50, (9,), generator=g).tolist()
    ref_a, ref_b = naive_logits(model, a), naive_logits(model, b)
    bs = 4
    cache = PagedKVCache.for_model(cfg, 16, bs)
    table_a, table_b = ([4, 5, 6, 7, 8, 9], [0, 1, 2]) if consecutive else ([9, 2, 14, 0, 7, 11], [3, 12, 5])
    steps = [  # (chunks of a and b): (tokens, start) per sequence; None = idle
        ((a[:5], 0), (b[:8], 0)),
        ((a[5:18], 5), (b[8:9], 8)),  # b's last prompt token rides along as a one-token chunk
        ((a[18:23], 18), None),
    ]
    with torch.inference_mode():
        for sa, sb in steps:
            chunks, ids, ref_rows = [], [], []
            for part, table, ref in ((sa, table_a, ref_a), (sb, table_b, ref_b)):
                if part is None:
                    continue
                toks, start = part
                chunks.append(ChunkSlots(table, start, len(toks)))
                ids += toks
                ref_rows.append(ref[start : start + len(toks)])
            meta = build_attention_metadata(chunks, bs)
            got = model(torch.tensor(ids), cache, meta)
            torch.testing.assert_close(got, torch.cat(ref_rows), atol=1e-4, rtol=1e-4)


def test_chat_template_equals_the_gguf_jinja_template():
    jinja2 = pytest.importorskip("jinja2")
    import json

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from longctx.model.weights import fetch_model

    template = json.loads((fetch_model() / "tokenizer_meta.json").read_text())["chat_template"]
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
    )
    for chat in CHATS:
        for gen in (True, False):
            expected = env.from_string(template).render(messages=chat, add_generation_prompt=gen)
            assert render_chat(chat, gen) == expected


@pytest.mark.slow
def test_config_and_tokenizer_from_the_gguf(smollm2, smollm2_tokenizer):
    model, tok = smollm2, smollm2_tokenizer
    def shape(spec):  # everything but where the numbers were read from
        return {k: v for k, v in spec_to_dict(spec).items() if k not in ("source", "notes")}

    assert shape(model.config) == shape(SMOLLM2_135M)
    assert model.config.num_params == SMOLLM2_135M.num_params == get_model("smollm2-135m").num_params
    assert tok.eos_token_id == 2 and tok.bos_token_id == 1
    ids = tok.encode("Hello <|im_start|>user\nabc 12345 ü 🤖")
    assert tok.decode(ids, skip_special_tokens=False) == "Hello <|im_start|>user\nabc 12345 ü 🤖"
    assert 1 in ids  # the special token stays whole


@pytest.mark.slow
def test_tokenizer_matches_transformers(hf_reference, smollm2_tokenizer):
    _, hf_tok = hf_reference
    tok = smollm2_tokenizer
    texts = PROMPTS + [
        "  leading spaces, tabs\tand\nnewlines\n\n",
        "Numbers: 3.14159, 2024-11-29, 1,000,000 and x**2",
        "Ünïcödé, 中文, emoji 🤖, and <|im_end|> in the middle",
        tok.apply_chat_template(CHATS[1]),
    ]
    for text in texts:
        assert tok.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"], text
    rendered = hf_tok.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True)
    assert tok.apply_chat_template(CHATS[0]) == rendered


def hf_greedy(model, ids: list[int], steps: int) -> list[int]:
    out, past = [], None
    x = torch.tensor([ids])
    with torch.inference_mode():
        for _ in range(steps):
            # transformers 5.24: "cache", not past_key_values
            res = model(input_ids=x, cache=past, use_cache=True)
            past = res.cache
            nxt = int(res.logits[0, -1].argmax())
            out.append(nxt)
            x = torch.tensor([[nxt]])
    return out


@pytest.mark.slow
def test_logits_match_transformers_within_1e_3(hf_reference, smollm2, smollm2_tokenizer):
    from longctx.engine.exactness import chunked_prefill_logits

    hf, _ = hf_reference
    tok = smollm2_tokenizer
    prompts = [tok.encode(p) for p in PROMPTS] + [tok.encode_chat(c) for c in CHATS]
    prompts.append(tok.encode(" ".join(PROMPTS) * 8))  # a few hundred tokens
    worst = 0.0
    for ids in prompts:
        ours = chunked_prefill_logits(smollm2, ids, None)
        with torch.inference_mode():
            ref = hf(input_ids=torch.tensor([ids])).logits[0].float()
        worst = max(worst, float((ours - ref).abs().max()))
    assert worst <= 1e-3, worst


@pytest.mark.slow
# fused: eager FlexAttention on a CPU costs ~30 ms per layer call on a quiet core, so fewer steps
@pytest.mark.parametrize(("backend", "steps", "prompts"), [("reference", 64, 2), ("fused", 12, 1)])
def test_greedy_tokens_match_transformers(hf_reference, smollm2, smollm2_tokenizer, backend, steps, prompts):
    from longctx.engine.llm import generate

    hf, _ = hf_reference
    tok = smollm2_tokenizer
    for ids in (tok.encode_chat(CHATS[0][0]["content"]), tok.encode(PROMPTS[2]))[:prompts]:
        assert generate(smollm2, ids, steps, attention_backend=backend) == hf_greedy(hf, ids, steps)
