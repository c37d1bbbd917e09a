"""The server as a vLLM user runs it: one large body never stalls the others (tokenizing off the event loop,
texts provably over the context refused untokenized, a body cap from the context), the API key, /ping and
/v1/models/{id}, and the fields vLLM accepts. The real tokenizer and engine loop with a scripted executor
(tests/test_server_api.py's), so it is fast; fields that need logits: test_server_fields_model below, on a
small random model through `build_app`."""

from __future__ import annotations

import json
import random
import threading
import time

import httpx
import pytest
from test_server_api import ScriptedExecutor, _assert_openai_error

from longctx.engine import ChunkedPrefillScheduler, Engine
from longctx.serve.app import create_app
from longctx.serve.async_engine import AsyncEngine
from longctx.serve.launch import free_port
from longctx.serve.limits import ContextLimits

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
MAX_GAP_S = 0.5  # the stated bound on a stream's inter-token gap (10 ms steps) while a big body is refused


@pytest.fixture(scope="module")
def tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer()


class Server:
    """uvicorn in a thread over a scripted engine with SmolLM2's context (8,192 tokens)."""

    def __init__(self, tokenizer, text=" the quick brown fox jumps", max_model_len=8192, step_s=0.01, **app):
        import uvicorn

        self.script = tokenizer.encode(text)
        engine = Engine(ScriptedExecutor(self.script, step_s), ChunkedPrefillScheduler(256), num_blocks=600,
                        block_size=16, max_model_len=max_model_len, eos_token_id=tokenizer.eos_token_id,
                        vocab_size=tokenizer.vocab_size)
        self.app = create_app(AsyncEngine(engine), tokenizer, MODEL, **app)
        self.url = f"http://127.0.0.1:{free_port()}"
        port = int(self.url.rsplit(":", 1)[1])
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def server(tokenizer):
    from longctx.serve.chat import ChatRenderer

    with Server(tokenizer, chat=ChatRenderer(tokenizer, trust_request_template=True)) as s:
        yield s


# ---- the bound ----
def test_the_token_lower_bound_holds_and_is_tight(tokenizer):
    limits = ContextLimits(tokenizer, 8192)
    assert limits.max_token_bytes == 81  # a newline and 80 spaces
    longest = "\n" + " " * 80
    assert len(tokenizer.encode(longest * 50)) == limits.min_tokens(longest * 50) == 50  # tight here
    rng = random.Random(0)
    alphabet = ["a", "the ", " ", "\n", "日本", "é", "<|im_start|>", "<|im_end|>", "  " * 20, "1234",
                "\ufffd", "\U0001f600", "{}", "=" * 16]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
        assert limits.min_tokens(text) <= len(tokenizer.encode(text)), text
    assert limits.body_limit_bytes == 6 * 81 * 8192 + 2**20


# ---- no request stalls another ----
def test_a_stream_keeps_its_pace_while_maximal_bodies_are_refused(server, tokenizer):
    limits = ContextLimits(tokenizer, 8192)
    url = server.url + "/v1/completions"
    head = b'{"prompt": "'
    maximal = head + b"hello world, " * ((limits.body_limit_bytes - 64) // 13) + b'", "max_tokens": 4}'
    near = "hello world, " * ((8192 - 16) * 81 // 13)  # under the bound: tokenized (~150K tokens), refused
    results = {}

    def big_requests():
        time.sleep(0.3)
        with httpx.Client(timeout=120) as c:
            t0 = time.monotonic()
            results["maximal"] = c.post(url, content=maximal)
            results["near"] = c.post(url, json={"prompt": near, "max_tokens": 4})
            results["chat"] = c.post(server.url + "/v1/chat/completions",
                                     json={"messages": [{"role": "user", "content": near}]})
            results["over"] = c.post(url, content=maximal + b" " * 2**20)
            results["span"] = (t0, time.monotonic())

    sender = threading.Thread(target=big_requests)
    body = {"prompt": "hi", "max_tokens": 400, "stream": True, "temperature": 0}
    times = []
    with httpx.Client(timeout=60) as c, c.stream("POST", url, json=body) as r:
        sender.start()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.monotonic())
    sender.join(120)
    start, end = results["span"]
    assert times[0] < start and end < times[-1], "the big requests did not overlap the stream"
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) <= MAX_GAP_S, f"a {max(gaps):.2f} s gap while a large body was refused"
    for key in ("maximal", "near", "chat"):
        err = _assert_openai_error(results[key], 400)
        assert err["code"] == "context_length_exceeded", err
    assert "at least" in results["maximal"].json()["error"]["message"]  # by its length, untokenized
    assert "at least" not in results["near"].json()["error"]["message"]  # counted
    assert _assert_openai_error(results["over"], 413)["code"] == "body_too_large"


# ---- the API key ----
def test_api_key_guards_every_v1_route(tokenizer):
    with Server(tokenizer, api_key="sekret") as s:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"),
                             ("POST", "/v1/chat/completions"), ("GET", f"/v1/models/{MODEL}")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}):
                r = httpx.request(method, s.url + path, headers=headers, json={"prompt": "hi"})
                assert _assert_openai_error(r, 401)["code"] == "invalid_api_key"
        ok = httpx.post(s.url + "/v1/completions", headers={"Authorization": "Bearer sekret"},
                        json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert httpx.get(s.url + "/health").status_code == 200
        assert httpx.get(s.url + "/ping").status_code == 200
        import openai

        client = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret")
        assert client.completions.create(model=MODEL, prompt="hi", max_tokens=1).usage.completion_tokens == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope").models.list()


def test_ping_and_a_model_card(server):
    assert httpx.get(server.url + "/ping").status_code == 200
    assert httpx.post(server.url + "/ping").status_code == 200
    card = httpx.get(f"{server.url}/v1/models/{MODEL}").json()
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 8192
    assert _assert_openai_error(httpx.get(server.url + "/v1/models/gpt-4"), 404)["code"] == "model_not_found"


# ---- the fields ----
def test_lax_numbers_are_read_as_vllm_reads_them(server):
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "hi", "temperature": "0.5", "max_tokens": 4.0, "n": "1", "seed": 3.0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
    boolean = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "temperature": True})
    _assert_openai_error(boolean, 400, "temperature")


def test_tools_unused_tool_history_and_template_kwargs(server, tokenizer):
    url = server.url + "/v1/chat/completions"
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    history = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    r = httpx.post(url, json={"messages": history, "tools": tools, "tool_choice": "none", "max_tokens": 2,
                              "chat_template_kwargs": {"enable_thinking": False}})
    assert r.status_code == 200, r.text
    plain = [{"role": m["role"], "content": m["content"] or ""} for m in history]
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode_chat(plain))  # the tools left out
    _assert_openai_error(httpx.post(url, json={"messages": history, "tools": tools}), 400, "tools")


def test_chat_template_and_continue_final_message(server, tokenizer):
    url = server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My answer is"}]
    r = httpx.post(url, json={"messages": msgs, "continue_final_message": True,
                              "add_generation_prompt": False, "max_tokens": 1})
    want = tokenizer.apply_chat_template(msgs, add_generation_prompt=False)
    want = want[: want.rindex("My answer is") + len("My answer is")]  # no <|im_end|>: the turn goes on
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode(want))
    r = httpx.post(url, json={"messages": msgs[:1], "max_tokens": 1,
                              "chat_template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"})
    assert r.json()["usage"]["prompt_tokens"] == len(tokenizer.encode("[Name a colour.]"))
    bad = httpx.post(url, json={"messages": msgs[:1], "chat_template": "{% for %}"})
    assert "not a valid Jinja template" in _assert_openai_error(bad, 400, "chat_template")["message"]
    with Server(tokenizer) as untrusting:  # vLLM's default: a request's template is code it does not run
        r = httpx.post(untrusting.url + "/v1/chat/completions",
                       json={"messages": msgs[:1], "chat_template": "{{ messages }}"})
        assert "--trust-request-chat-template" in _assert_openai_error(r, 400, "chat_template")["message"]


def test_include_stop_str_in_output(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 12, "stop": [" brown"],
                                                         "include_stop_str_in_output": True})
    assert r.json()["choices"][0]["text"] == " the quick brown"


def test_chat_without_max_tokens_runs_to_the_context_left(tokenizer):
    with Server(tokenizer, max_model_len=96, step_s=0.001) as s:
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        usage = r.json()["usage"]
        assert r.json()["choices"][0]["finish_reason"] == "length" and usage["total_tokens"] == 96


def test_a_cut_inside_a_character_sends_no_replacement_character(tokenizer):
    with Server(tokenizer, text=" 日本語 ok") as s:  # tokens 5 and 6 are two parts of 語
        for stream in (False, True):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": stream})
            if stream:
                text = "".join(json.loads(ln[6:])["choices"][0]["text"] for ln in r.text.splitlines()
                               if ln.startswith("data: {") and json.loads(ln[6:])["choices"])
            else:
                text = r.json()["choices"][0]["text"]
            assert text == " 日本"


def test_under_pool_pressure_every_request_queues_as_in_vllm(tokenizer):
    """A pool of 2 blocks runs two requests at a time; 300 at once all wait their turn (no 503: vLLM has no
    queue limit, and neither has this server unless --max-waiting sets one)."""
    import asyncio

    import uvicorn

    script = tokenizer.encode(" the quick brown fox")
    engine = Engine(ScriptedExecutor(script, 0.001), ChunkedPrefillScheduler(64), num_blocks=2, block_size=16,
                    max_model_len=32, eos_token_id=tokenizer.eos_token_id, vocab_size=tokenizer.vocab_size)
    app = create_app(AsyncEngine(engine), tokenizer, MODEL)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)

    async def all_at_once():
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=120, limits=limits) as c:
            body = {"prompt": "hi", "max_tokens": 3}
            return await asyncio.gather(*(c.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
                                          for _ in range(300)))

    try:
        codes = [r.status_code for r in asyncio.run(all_at_once())]
    finally:
        server.should_exit = True
        thread.join(10)
    assert codes == [200] * 300
