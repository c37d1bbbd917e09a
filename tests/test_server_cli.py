"""`python -m longctx serve` with vLLM's command line: no abbreviations, vLLM's flag names and spellings
mapped to ours or refused in one line, a positional model, the pool that must hold one request of
--max-model-len; and the fields that need logits (prompt_logprobs, min_p) through `build_app` over a small
random model with SmolLM2's vocabulary."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from longctx.__main__ import build_parser, main
from longctx.cli.serve import kv_cache_dtype, model_ref, scheduler_name
from longctx.serve.launch import build_app, free_port


def parse(*argv):
    return build_parser().parse_args(["serve", *argv])


def test_no_parser_reads_an_abbreviation(capsys):
    assert parse("--model", "smollm2-135m").model == "smollm2-135m"  # not --model-name's value
    assert parse("--model", "smollm2-135m").model_name is None
    with pytest.raises(SystemExit) as exc:
        parse("--max-num", "4")
    assert exc.value.code == 2 and "unrecognized arguments: --max-num" in capsys.readouterr().err
    for command in ("bench", "generate", "plan", "simulate"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--he"])  # no parser expands --he to --help


def test_vllms_names_and_todays_aliases():
    a = parse("smollm2-135m", "--max-num-batched-tokens", "128", "--num-gpu-blocks-override", "64",
              "--served-model-name", "mine", "other", "--kv-cache-dtype", "fp8_e4m3", "--dtype", "bfloat16",
              "--no-enable-chunked-prefill", "--enable-prefix-caching", "--max-num-seqs", "8",
              "--max-model-len", "512", "--block-size", "32", "--uvicorn-log-level", "info",
              "--disable-log-requests", "--api-key", "k")
    assert (a.token_budget, a.kv_blocks, a.model_name, a.dtype) == (128, 64, ["mine", "other"], "bf16")
    assert kv_cache_dtype(a.kv_dtype) == "fp8" and scheduler_name(a) == "monolithic"
    assert model_ref(a) == "smollm2-135m"
    assert a.prefix_caching and a.max_num_seqs == 8 and a.max_model_len == 512 and a.block_size == 32
    old = parse("--token-budget", "128", "--kv-blocks", "64", "--model-name", "mine", "--kv-dtype", "int8",
                "--prefix-caching", "--scheduler", "chunked")
    got = (old.token_budget, old.kv_blocks, old.model_name, kv_cache_dtype(old.kv_dtype))
    assert got == (128, 64, ["mine"], "int8")
    assert parse("--no-enable-prefix-caching").prefix_caching is False
    assert kv_cache_dtype("auto") is None and parse("--dtype", "float16").dtype == "fp16"


@pytest.mark.parametrize(("argv", "message"), [
    (["--kv-cache-dtype", "fp8_e5m2"], "no E5M2"),
    (["--kv-cache-dtype", "fp4"], "unknown kv_dtype 'fp4'"),
    (["--gpu-memory-utilization", "0.9"], "on a CPU give the pool in blocks: --num-gpu-blocks-override"),
    (["--scheduler", "monolithic", "--enable-chunked-prefill"], "contradicts --enable-chunked-prefill"),
    (["a-model", "--model", "b-model"], "two models given"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be >= 1"),
    (["gemma-9000"], "unknown model 'gemma-9000'; allowed: smollm2-135m"),  # before the banner and the model
])
def test_refused_flags_say_why_in_one_line(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    out, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1 and not out


def test_an_unknown_model_is_refused_by_the_one_loading_function():
    from longctx.serve.launch import _load_model_and_tokenizer

    with pytest.raises(ValueError, match=r"unknown model 'gemma-9000'; allowed: smollm2-135m, "):
        _load_model_and_tokenizer("gemma-9000", "cpu", None, "auto")


@pytest.fixture(scope="module")
def tiny():
    from longctx.model.llama import Llama
    from longctx.model.tokenizer import load_tokenizer
    from longctx.specs import ModelSpec

    spec = ModelSpec(name="tiny-smollm2-vocab", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                     head_dim=8, source="test", intermediate_size=48, vocab_size=load_tokenizer().vocab_size,
                     rope_theta=10000.0, max_context=2048)
    return Llama(spec).init_random_(seed=3, std=0.3).eval()


def test_the_pool_must_hold_one_request_of_max_model_len(tiny):
    with pytest.raises(ValueError, match="fewer than one request of --max-model-len 2048"):
        build_app(model=tiny, kv_blocks=64, max_model_len=2048)  # 64 x 16 = 1024 tokens
    with pytest.raises(ValueError, match="over the model's context of 2048"):
        build_app(model=tiny, kv_blocks=256, max_model_len=4096)
    with pytest.raises(ValueError, match="sizes the KV pool from CUDA memory"):
        build_app(model=tiny, gpu_memory_utilization=0.5)  # a model on a CPU
    app = build_app(model=tiny, kv_blocks=64, max_model_len=1024)  # what the pool holds: it starts
    assert [r.path for r in app.routes if r.path == "/v1/models"]


@pytest.fixture(scope="module")
def served(tiny):
    import uvicorn

    port = free_port()
    app = build_app(model=tiny, kv_blocks=64, model_name=["mine", "alias"])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_served_names_and_the_models_context(served):
    models = httpx.get(served + "/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["mine"]
    assert models[0]["max_model_len"] == 2048  # not given: the model's context
    for name in ("mine", "alias", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        r = httpx.post(served + "/v1/completions", json={"model": name, "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == name


def test_prompt_logprobs_as_vllm_returns_them(served):
    from longctx.model.tokenizer import load_tokenizer

    ids = load_tokenizer().encode("The capital of France is")
    r = httpx.post(served + "/v1/completions", json={"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2})
    pl = r.json()["choices"][0]["prompt_logprobs"]
    assert len(pl) == len(ids) and pl[0] is None
    for token, entry in zip(ids[1:], pl[1:], strict=True):
        assert str(token) in entry and 2 <= len(entry) <= 3
        ranks = sorted(v["rank"] for v in entry.values())
        assert ranks[:2] == [1, 2] and all(v["logprob"] <= 0 for v in entry.values())
    echo = httpx.post(served + "/v1/completions", json={"prompt": ids, "max_tokens": 1, "echo": True,
                                                         "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert [pl[i][str(t)]["logprob"] for i, t in enumerate(ids) if i] == pytest.approx(
        echo["token_logprobs"][1:len(ids)], abs=1e-5)
    chat = httpx.post(served + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert chat["prompt_logprobs"][0] is None
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]


def test_min_p_one_keeps_only_the_most_likely_token(served):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 2.0, "seed": 1}
    def text(**fields):
        return httpx.post(served + "/v1/completions", json={**body, **fields}).json()["choices"][0]["text"]

    greedy = text(temperature=0)
    drawn = {text(min_p=1.0, seed=s) for s in range(3)}
    assert drawn == {greedy}  # min_p 1: only the top token survives, whatever the temperature
    loose = {text(seed=s) for s in range(3)}
    assert loose != {greedy}  # the same draws without min_p wander (the test can tell them apart)


def test_chat_without_max_tokens_stops_at_what_the_pool_holds(served):
    """The context left is 2048 - prompt, but a pool of 64 x 16 = 1024 tokens holds less: vLLM never meets
    this (its pool holds one max_model_len request), so the default is what the pool holds."""
    r = httpx.post(served + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "temperature": 0, "ignore_eos": True},
                   timeout=300)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] == 1024 and r.json()["choices"][0]["finish_reason"] == "length"


def test_block_size_max_num_seqs_and_a_monolithic_budget_reach_the_engine(tiny):
    from fastapi.testclient import TestClient

    app = build_app(model=tiny, kv_blocks=32, block_size=32, max_num_seqs=2, scheduler="monolithic",
                    token_budget=64)
    with TestClient(app) as c:
        assert c.get("/health").json()["block_size"] == 32
        r = c.post("/v1/completions", json={"prompt": ["a b c", "d e f", "g h i"], "max_tokens": 3,
                                            "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        text = c.get("/metrics").text
    assert 'block_size="32"' in text
    steps = [ln for ln in text.splitlines() if ln.startswith("vllm:iteration_tokens_total_count")]
    assert float(steps[0].split()[-1]) >= 5  # at most 2 sequences at once: 3 prompts take more steps
