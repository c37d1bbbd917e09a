"""`python -m longctx serve` with the real SmolLM2 in a child process on 127.0.0.1: the official openai
client against it, outputs equal to greedy `generate`, seeded sampling, a disconnect mid-stream, and a
bounded soak test (64 concurrent streaming clients, 256 requests) that must end with no errors, no leaked
KV blocks and a healthy server."""

from __future__ import annotations

import time

import httpx
import pytest

from longctx.serve.launch import ServerProcess

pytestmark = pytest.mark.slow
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(kv_blocks=256, token_budget=512, threads=2) as s:
        yield s


def _greedy(ids, max_tokens):
    from model_fixtures import our_model, our_tokenizer

    from longctx.engine import generate

    return generate(our_model(), ids, max_tokens, eos_token_id=our_tokenizer().eos_token_id)


def _wait_idle(server, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        h = server.health()
        if h["num_free_blocks"] == h["num_blocks"] and h["num_in_flight"] == 0 and h["num_running"] == 0:
            return h
        time.sleep(0.1)
    raise AssertionError(f"KV blocks or requests leaked: {server.health()}")


def test_openai_client_matches_greedy_generate(server):
    import openai
    from model_fixtures import our_tokenizer

    tok = our_tokenizer()
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    question = "What is the capital of France?"
    want = _greedy(tok.encode_chat(question), 12)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=12, temperature=0
    )
    assert chat.choices[0].message.content == tok.decode(want)
    assert chat.usage.prompt_tokens == len(tok.encode_chat(question))
    assert chat.usage.completion_tokens == len(want)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == tok.decode(want)

    prompt = "The three primary colors are"
    want = _greedy(tok.encode(prompt), 10)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert out.choices[0].text == tok.decode(want) and out.usage.completion_tokens == len(want)
    parts = [
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True
        )
        if c.choices
    ]
    assert "".join(parts) == tok.decode(want)


def test_chat_matches_the_generate_command(server):
    import subprocess
    import sys

    question = "Name three fruits."
    cli = subprocess.run(
        [sys.executable, "-m", "longctx", "generate", "--prompt", question, "--max-tokens", "10"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 10,
        "temperature": 0,
    }
    got = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()
    assert got["choices"][0]["message"]["content"] + "\n" == cli.stdout


def test_seeded_sampling_is_reproducible(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9, "seed": 7}
    a = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    b = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    assert a == b


def test_disconnect_mid_stream_frees_blocks(server):
    story = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
    body = {"model": MODEL, "messages": story, "max_tokens": 300, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        next(ln for ln in lines if ln.startswith("data: "))
        h = server.health()
        assert h["num_free_blocks"] < h["num_blocks"]
    _wait_idle(server)


def test_soak_64_concurrent_streaming_clients(server):
    from model_fixtures import our_tokenizer

    from longctx.bench.client import run_benchmark
    from longctx.bench.client_metrics import summarize
    from longctx.bench.workloads import build_workload

    requests = build_workload("chat", 256, our_tokenizer(), prompt_tokens=40, max_tokens=3, seed=1)
    # bounded by the request count and a 120 s timeout per request; no wall-clock assertion (the course puts
    # speed targets in benchmarks/, and a shared 2-core machine can be several times slower than a quiet one)
    records, duration_s = run_benchmark(server.base_url, MODEL, requests, concurrency=64, timeout_s=120)
    s = summarize(records, duration_s)
    assert s["failed"] == 0, s["errors"]
    assert s["completed"] == 256 and s["total_output_tokens"] <= 256 * 3
    h = _wait_idle(server)
    assert h["status"] == "ok"
    assert httpx.get(server.base_url + "/health").status_code == 200
