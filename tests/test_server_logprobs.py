"""The real SmolLM2 behind `python -m longctx serve` (a child process on 127.0.0.1) with the fields lm-eval,
guidellm and the openai client use: prompt log-probabilities with `echo` equal transformers' on the same ids,
sampled tokens' log-probabilities (completions and chat) equal the prompt's for the same text, n > 1 sharing
the prompt's KV blocks through prefix caching, batched prompts, logit_bias / top_k / penalties / min_tokens /
ignore_eos changing what they should, latency histograms, and a disconnect freeing every sequence's blocks."""

from __future__ import annotations

import math
import time

import httpx
import pytest

from longctx.serve.launch import ServerProcess

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(kv_blocks=128, token_budget=32, threads=2, prefix_caching=True) as s:
        yield s


def _post(server, path, body):
    r = httpx.post(server.base_url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _wait_idle(server, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        h = server.health()
        if h["num_running"] == 0 and h["num_in_flight"] == 0 and h["num_free_blocks"] == h["num_blocks"]:
            return h
        time.sleep(0.1)
    raise AssertionError(f"KV blocks or requests leaked: {server.health()}")


def test_echo_prompt_logprobs_equal_transformers(server, hf_reference):
    import torch

    from longctx.model.tokenizer import load_tokenizer

    ids = load_tokenizer().encode(" ".join([PROMPT + " Madrid."] * 4))  # 84 tokens: prefilled in 3 chunks of
    assert len(ids) > 2 * 32  # at most 32 (the server's token budget), so the rows cross two chunk boundaries
    out = _post(server, "/v1/completions", {"prompt": [ids], "echo": True, "logprobs": 2, "max_tokens": 1,
                                            "temperature": 0})
    lp = out["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["token_logprobs"]) == len(ids) + 1
    model, _ = hf_reference
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    # greedy last token
    want = [ref[p - 1, ids[p]].item() for p in range(1, len(ids))] + [ref[-1].max().item()]
    got = lp["token_logprobs"][1:]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-3
    for p in range(1, len(ids)):  # the 2 most likely tokens plus the prompt's own
        top = lp["top_logprobs"][p]
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(ref[p - 1].max().item(), abs=1e-3)
    assert out["choices"][0]["text"].startswith(PROMPT + " Madrid. " + PROMPT)


def test_sampled_logprobs_match_the_prompts_and_chat_reports_them(server):
    from longctx.model.tokenizer import load_tokenizer

    tok = load_tokenizer()
    ids = tok.encode(PROMPT)
    gen = _post(server, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0, "logprobs": 0})
    logprobs = gen["choices"][0]["logprobs"]
    sampled = logprobs["token_logprobs"]
    assert len(sampled) == 4 and all(v <= 0 for v in sampled)
    out_ids = [tok.encode(t) for t in logprobs["tokens"]]
    assert all(len(t) == 1 for t in out_ids)
    echo = _post(server, "/v1/completions", {"prompt": ids + [t[0] for t in out_ids], "max_tokens": 1,
                                             "echo": True, "logprobs": 0, "temperature": 0})
    scored = echo["choices"][0]["logprobs"]["token_logprobs"][-5:-1]  # the same 4 tokens, read as a prompt
    assert max(abs(a - b) for a, b in zip(sampled, scored, strict=True)) < 1e-3
    chat = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}],
                                                  "max_tokens": 3, "logprobs": True, "top_logprobs": 2})
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] for c in content)


def test_n_sequences_share_the_prompt_through_the_prefix_cache(server):
    before = server.metrics()
    body = {"prompt": PROMPT * 3, "max_tokens": 3, "n": 3, "temperature": 0.8, "seed": 5}
    out = _post(server, "/v1/completions", body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["completion_tokens"] == 9
    after = server.metrics()
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    n_prompt = out["usage"]["prompt_tokens"]
    assert hits >= 2 * (n_prompt // 16) * 16  # the 2nd and 3rd sequences take the 1st one's full blocks
    assert _post(server, "/v1/completions", body)["choices"] == out["choices"]  # seeded: reproducible
    _wait_idle(server)


def test_batched_prompts_answer_in_order(server):
    a = _post(server, "/v1/completions", {"prompt": "One, two,", "max_tokens": 3, "temperature": 0})
    b = _post(server, "/v1/completions", {"prompt": "Red, green,", "max_tokens": 3, "temperature": 0})
    both = _post(server, "/v1/completions", {"prompt": ["One, two,", "Red, green,"], "max_tokens": 3,
                                             "temperature": 0, "n": 2})
    texts = [c["text"] for c in sorted(both["choices"], key=lambda c: c["index"])]
    assert texts == [a["choices"][0]["text"]] * 2 + [b["choices"][0]["text"]] * 2


def test_logit_changes_do_what_they_say(server):
    from longctx.model.tokenizer import load_tokenizer

    tok = load_tokenizer()

    def first_token(**kw):
        body = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 0, **kw}
        return _post(server, "/v1/completions", body)["choices"][0]["logprobs"]["tokens"][0]

    greedy = first_token()
    banned = first_token(logit_bias={str(tok.encode(greedy)[0]): -100})
    assert banned != greedy
    assert first_token(temperature=1.0, top_k=1, seed=3) == greedy  # top_k=1 is greedy
    rep = _post(server, "/v1/completions", {"prompt": "a a a a a a a a", "max_tokens": 4, "temperature": 0})
    pen = _post(server, "/v1/completions", {"prompt": "a a a a a a a a", "max_tokens": 4, "temperature": 0,
                                            "repetition_penalty": 2.0, "presence_penalty": 2.0})
    assert rep["choices"][0]["text"] != pen["choices"][0]["text"]
    chat = {"messages": [{"role": "user", "content": "Say only: yes"}], "max_tokens": 12, "temperature": 0}
    short = _post(server, "/v1/chat/completions", chat)
    assert short["choices"][0]["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 12
    for extra in ({"ignore_eos": True}, {"min_tokens": 12}):
        long = _post(server, "/v1/chat/completions", {**chat, **extra})
        assert long["usage"]["completion_tokens"] == 12 and long["choices"][0]["finish_reason"] == "length"
    greedy_id = tok.encode(greedy)[0]  # min_tokens also forbids the stop token ids until it is reached (vLLM)
    held = _post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0,
                                             "logprobs": 0, "stop_token_ids": [greedy_id],
                                             "min_tokens": 2})["choices"][0]
    assert held["logprobs"]["tokens"][0] != greedy and held["finish_reason"] == "length"
    oov = httpx.post(server.base_url + "/v1/completions", timeout=30,
                     json={"prompt": PROMPT, "logit_bias": {str(tok.vocab_size): 5}})
    assert oov.status_code == 400 and oov.json()["error"]["param"] == "logit_bias", oov.text
    assert "outside the vocabulary" in oov.json()["error"]["message"]


def test_latency_histograms_use_vllms_names(server):
    _post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "temperature": 0})
    m = server.metrics()
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert m[f"vllm:{name}_count"] >= 1 and math.isfinite(m[f"vllm:{name}_sum"])
    assert m["vllm:inter_token_latency_seconds_count"] >= 2


def test_a_client_leaving_an_n_2_stream_frees_every_sequence(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 200, "n": 2, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(ln for ln in lines if ln.startswith("data: "))
        assert server.health()["num_running"] == 2
    _wait_idle(server)
