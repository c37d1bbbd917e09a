"""Gemma 3 270M in our engine equals transformers' Gemma3ForCausalLM on the same GGUF (tokens, logits,
tokenizer), chunked prefill changes no token, and the hybrid KV cache keeps a sliding layer's blocks bounded
while a global layer's grow (a tiny random Gemma for the bookkeeping, the real one for parity)."""

from __future__ import annotations

import random

import pytest
import torch
from model_fixtures import gemma_model, gemma_reference, gemma_tokenizer

from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler, TorchExecutor, generate
from longctx.kv.hybrid import HybridBlockManager, block_manager_for, kv_cache_groups
from longctx.memory import blocks_for_tokens, sliding_blocks_bound
from longctx.model.config import GEMMA3_270M, resized
from longctx.model.gemma3 import Gemma3
from longctx.specs import get_model

# short prompts of every kind the tokenizer must get right, and a passkey prompt
PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "In 1969, 3 astronauts flew to the Moon; 2 of them walked on it. Why does it matter?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint(fib(10))  # prints",
    "Paris is the capital of",
    "  Two spaces,\tthen a tab,\n\n\nthen three newlines:",
    "Ünïcödé, 漢字 and emoji 🙂 in one sentence:",
    "The pass key is 58213. Remember it. 58213 is the pass key.\nWhat is the pass key? The pass key is",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
]
MORE_TEXTS = ["", " ", "    ", "a\u00a0b", "1234567890" * 5, "\u2581 literal block", "<bos> as text"]


def _long_prompt(tok, num_tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    key = rng.randint(10000, 99999)
    filler = " ".join(f"Line {i}: the grass is green and the sky is blue." for i in range(num_tokens // 12))
    ids = tok.prompt_ids(filler)[: num_tokens - 40]
    return ids + tok.encode(f" The pass key is {key}. Remember it. What is the pass key? The pass key is")


@pytest.mark.slow
def test_tokenizer_equals_transformers_on_digits_whitespace_unicode_and_passkeys():
    _, hf_tok = gemma_reference()
    tok = gemma_tokenizer()
    for text in PROMPTS + MORE_TEXTS:
        assert tok.prompt_ids(text) == hf_tok(text)["input_ids"], repr(text)
        if "\u2581" not in text:  # SentencePiece writes a space as U+2581: a literal one decodes as a space
            assert tok.decode(tok.encode(text), skip_special_tokens=False) == text, repr(text)


@pytest.mark.slow
def test_greedy_tokens_and_logits_equal_transformers():
    hf, _ = gemma_reference()
    model, tok = gemma_model(), gemma_tokenizer()
    worst = 0.0
    for text in PROMPTS:
        ids = tok.prompt_ids(text)
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
            ref_logits = hf(torch.tensor([ids])).logits[0, -1]
        assert generate(model, ids, 6) == ref, text
        from longctx.evals.forcing import forward_at
        from longctx.kv.cache import PagedKVCache

        n = blocks_for_tokens(len(ids), 16)
        cache = PagedKVCache.for_model(model.config, n, 16)
        ours = forward_at(model, cache, list(range(n)), ids, 0, [len(ids) - 1])[0]
        worst = max(worst, float((ours - ref_logits).abs().max()))
    assert worst < 2e-3, worst  # fp32 on both sides: rounding only (logits span about +-30)


@pytest.mark.slow
def test_a_prompt_past_2k_gives_transformers_tokens_whatever_the_chunking():
    """A 2,300-token passkey prompt in chunks of 512 (each ending exactly on the window) and of 700 (the
    window crossed inside a chunk) gives transformers' greedy tokens (its monolithic prefill)."""
    hf, _ = gemma_reference()
    model, tok = gemma_model(), gemma_tokenizer()
    ids = _long_prompt(tok, 2300)
    assert len(ids) > 2048
    with torch.inference_mode():
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0, len(ids):].tolist()
    for chunk in (512, 700):
        assert generate(model, ids, 4, chunk_size=chunk) == ref, chunk


def _tiny_gemma(window: int = 32):
    spec = resized(GEMMA3_270M, num_layers=6, d_model=64, num_heads=2, num_kv_heads=1, head_dim=16,
                   intermediate_size=96, vocab_size=300, sliding_window=window, max_context=4096)
    torch.manual_seed(0)
    return Gemma3(spec).init_random_(seed=1, std=0.2).eval()


def test_kv_cache_groups_split_gemma_into_equal_groups_of_one_kind():
    groups = kv_cache_groups(get_model("gemma3-270m"))
    assert [g.layers for g in groups] == [(5, 11, 17), (0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15),
                                          (4, 10, 16)]
    assert [g.window for g in groups] == [None] + [512] * 5
    assert [g.layers for g in kv_cache_groups(get_model("smollm2-135m"))] == [tuple(range(30))]


@pytest.mark.parametrize("chunk", [7, 16, 40, 1000])
def test_a_sliding_group_holds_a_bounded_number_of_blocks_while_a_global_one_grows(chunk):
    model = _tiny_gemma(window=32)
    bs, prompt_len, max_tokens = 8, 300, 60
    pool = block_manager_for(model.config, 2000, bs)
    assert isinstance(pool, HybridBlockManager)
    scheduler = MonolithicScheduler() if chunk == 1000 else ChunkedPrefillScheduler(chunk)
    engine = Engine(TorchExecutor(model, pool), scheduler)
    ids = [random.Random(3).randrange(5, 300) for _ in range(prompt_len)]
    seq = engine.add_request(ids, max_tokens)
    prefill_bound = sliding_blocks_bound(32, bs, min(chunk, prompt_len))
    decode_bound = sliding_blocks_bound(32, bs, 1)  # 5 blocks of 8 for a window of 32
    seen_global = []
    while engine.has_unfinished():
        # steady decoding: a block filled since the prefill (a full last block is when blocks are given back)
        decoding = seq.num_computed_tokens >= prompt_len + bs
        engine.step()
        pool.check_invariants()
        held = pool.blocks_held(seq.seq_id)
        if not held:
            break
        bound = decode_bound if decoding else prefill_bound
        assert all(h <= bound for h in held[1:]), (held, bound, decoding)
        assert held[0] == blocks_for_tokens(seq.num_computed_tokens, bs)  # a global group holds every token
        seen_global.append(held[0])
    assert seen_global[-1] == blocks_for_tokens(prompt_len + max_tokens - 1, bs)
    assert seen_global[-1] > 8 * decode_bound  # ... far more than a sliding group holds while decoding
    assert pool.num_free_blocks == 2000  # all back once it finished


def test_hybrid_pool_gives_the_tokens_of_a_pool_that_keeps_every_block():
    """The engine over the hybrid pool (sliding blocks given back) equals a forward pass whose cache keeps
    every key of every layer (the evals' contiguous cache), on a prompt 10x the window."""
    from longctx.evals.forcing import forward_at
    from longctx.kv.cache import PagedKVCache

    model = _tiny_gemma(window=24)
    ids = [random.Random(5).randrange(5, 300) for _ in range(250)]
    out = generate(model, ids, 8, chunk_size=37, block_size=8)
    n = blocks_for_tokens(len(ids) + 8, 8)
    cache, ref = PagedKVCache.for_model(model.config, n, 8), []
    logits = forward_at(model, cache, list(range(n)), ids, 0, [len(ids) - 1], block_size=8)
    for k in range(8):
        ref.append(int(logits[0].argmax()))
        logits = forward_at(model, cache, list(range(n)), [ref[-1]], len(ids) + k, [0], block_size=8)
    assert out == ref


def test_hybrid_pool_refuses_what_it_does_not_support_in_one_line():
    spec = get_model("gemma3-270m")
    with pytest.raises(ValueError, match="prefix caching is not supported"):
        block_manager_for(spec, 10, 16, enable_prefix_caching=True)
    pool = block_manager_for(spec, 60, 16)
    with pytest.raises(ValueError, match="not supported"):
        pool.shrink(0, 1)
    from longctx.kv.press import StreamingLLMPress

    model = _tiny_gemma()
    with pytest.raises(ValueError, match="presses are not supported"):
        TorchExecutor(model, block_manager_for(model.config, 60, 16), press=StreamingLLMPress(0.5))
    with pytest.raises(ValueError, match="needs a HybridBlockManager"):
        from longctx.kv.block_manager import BlockManager

        TorchExecutor(model, BlockManager(60, 16))
    with pytest.raises(ValueError, match="RoPE scaling is not implemented"):
        model.rope_scaling = {"rope_type": "linear", "factor": 2.0}


def test_the_planner_counts_a_hybrid_users_blocks_as_the_engine_holds_them():
    """plan(): a user's global groups hold every token's block, each sliding group at most the window and
    the chunk; the engine's pool, run on the same shape, never holds more (and its global group exactly
    that many)."""
    from longctx.plan import plan

    model = _tiny_gemma(window=32)
    spec, bs, chunk, prompt_len, out = model.config, 8, 40, 300, 20
    context = prompt_len + out
    p = plan(spec, "fp32", users=1, context=context, block_size=bs, pool_bytes=10**8, chunk_tokens=chunk)
    full, bound = blocks_for_tokens(context, bs), sliding_blocks_bound(32, bs, chunk)
    groups = kv_cache_groups(spec)
    assert p.kv_groups == len(groups) == 6
    assert p.per_user_blocks == 1 * full + 5 * bound
    assert p.block_bytes == bs * 2 * len(groups[0].layers) * spec.num_kv_heads * spec.head_dim * 4
    pool = block_manager_for(spec, 2000, bs)
    engine = Engine(TorchExecutor(model, pool), ChunkedPrefillScheduler(chunk))
    seq = engine.add_request([5 + i % 290 for i in range(prompt_len)], out)
    peak = [0] * 6
    while engine.has_unfinished():
        engine.step()
        peak = [max(a, b) for a, b in zip(peak, pool.blocks_held(seq.seq_id) or peak, strict=True)]
    assert peak[0] == blocks_for_tokens(context - 1, bs)  # the last output token is never computed
    assert all(b <= bound for b in peak[1:]) and sum(peak) <= p.per_user_blocks
    with pytest.raises(ValueError, match="prefix"):
        plan(spec, "fp32", users=2, context=context, shared_prefix=64, block_size=bs, pool_bytes=10**8)


@pytest.mark.slow
def test_the_server_serves_gemma_prompt_logprobs_as_transformers_and_refuses_chat():
    """`serve --model gemma3-270m`: /v1/completions with echo + logprobs gives transformers' prompt
    log-probabilities (BOS first, from the text), the prompt crossing two chunks of the token budget; chat on
    a model without a template is a 400 that names it."""
    import httpx

    from longctx.serve.launch import ServerProcess

    hf, _ = gemma_reference()
    tok = gemma_tokenizer()
    text = " ".join(PROMPTS[:3])
    ids = tok.prompt_ids(text)
    assert ids[0] == tok.bos_token_id and len(ids) > 2 * 32
    with ServerProcess(model="gemma3-270m", token_budget=32, threads=2) as s:
        r = httpx.post(s.base_url + "/v1/completions", timeout=120, json={
            "model": "gemma3-270m", "prompt": text, "echo": True, "logprobs": 0, "max_tokens": 1,
            "temperature": 0})
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["logprobs"]["token_logprobs"]
        chat = httpx.post(s.base_url + "/v1/chat/completions", timeout=60, json={
            "model": "gemma3-270m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    with torch.inference_mode():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    want = [ref[p - 1, ids[p]].item() for p in range(1, len(ids))] + [ref[-1].max().item()]
    assert got[0] is None and len(got) == len(ids) + 1
    assert max(abs(a - b) for a, b in zip(got[1:], want, strict=True)) < 2e-3
    assert chat.status_code == 400 and "no chat template" in chat.json()["error"]["message"]


@pytest.mark.slow
def test_the_servers_token_lower_bound_holds_for_gemmas_sentencepiece():
    """The server refuses a text untokenized when its bytes alone prove it over the context
    (``longctx.serve.limits``): the bound must hold for SentencePiece too (spaces spelled U+2581, bytes
    through fallback tokens)."""
    from longctx.serve.limits import ContextLimits

    tok = gemma_tokenizer()
    limits = ContextLimits(tok, 32768)
    rng = random.Random(1)
    alphabet = ["a", "the ", " ", "   ", "\n", "\n\n\n", "日本", "é", "<bos>", "1234", "\ufffd", "\U0001f600",
                "{}", "=" * 16, "\t", "\u00a0", "\u2581"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        assert limits.min_tokens(text) <= len(tok.encode(text)), text
