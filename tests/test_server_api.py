"""The OpenAI-compatible server's HTTP contract, on the real tokenizer and engine loop with a scripted
executor (no model: fast). Every error case returns OpenAI's error shape and status; disconnects free
the KV blocks; the official openai client works against it. The real model: tests/test_server_model.py."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from longctx.engine import ChunkedPrefillScheduler, Engine
from longctx.engine.executor import ExecutionResult, Executor
from longctx.serve.app import create_app
from longctx.serve.async_engine import AsyncEngine
from longctx.serve.launch import free_port

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer()


class ScriptedExecutor(Executor):
    """Every sequence generates ``script`` (cycled) one token per step; each step sleeps ``step_s``."""

    def __init__(self, script: list[int], step_s: float = 0.01):
        self.script, self.step_s = script, step_s

    def execute(self, batch):
        time.sleep(self.step_s)
        ids = [self.script[e.seq.num_output_tokens % len(self.script)] for e in batch.entries]
        return ExecutionResult(self.step_s, ids)


class Server:
    """uvicorn in a thread on a free port, over an engine with a scripted executor."""

    def __init__(
        self, tokenizer, num_blocks=64, max_waiting=16, step_s=0.01, text=" the quick brown fox jumps"
    ):
        import uvicorn

        self.script = tokenizer.encode(text)
        self.engine = Engine(
            ScriptedExecutor(self.script, step_s),
            ChunkedPrefillScheduler(64),
            num_blocks=num_blocks,
            block_size=16,
            max_model_len=512,
            eos_token_id=tokenizer.eos_token_id,
            vocab_size=tokenizer.vocab_size,
        )
        self.aengine = AsyncEngine(self.engine, max_waiting=max_waiting)
        app = create_app(self.aengine, tokenizer, MODEL)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                return self
            time.sleep(0.02)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def health(self):
        return httpx.get(self.url + "/health").json()

    def wait_idle(self, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            h = self.health()
            if h["num_free_blocks"] == h["num_blocks"] and h["num_in_flight"] == 0 and h["num_running"] == 0:
                return h
            time.sleep(0.05)
        raise AssertionError(f"blocks or requests leaked: {self.health()}")


@pytest.fixture(scope="module")
def server(tokenizer):
    with Server(tokenizer) as s:
        yield s


def _assert_openai_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def test_models_and_health(server):
    models = httpx.get(server.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    h = server.health()
    assert h["status"] == "ok" and h["num_blocks"] == 64


def test_completion_text_and_usage(server, tokenizer):
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": "Hello there", "max_tokens": 5, "temperature": 0},
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert body["choices"][0]["text"] == tokenizer.decode(server.script[:5])
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": len(tokenizer.encode("Hello there")),
        "completion_tokens": 5,
        "total_tokens": len(tokenizer.encode("Hello there")) + 5,
    }


def test_stream_one_chunk_per_token_then_done(server, tokenizer):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    import json

    events = [json.loads(ln[6:]) for ln in lines[:-1]]
    token_chunks = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"] is None]
    assert len(token_chunks) == 4
    assert token_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"]["content"] for e in token_chunks) == tokenizer.decode(
        server.script[:4]
    )
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    assert events[-1]["usage"]["prompt_tokens"] == len(tokenizer.encode_chat("Hi"))


def test_stop_string_cuts_the_text_and_frees_blocks(server):
    r = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 12, "temperature": 0, "stop": [" brown"]},
    )
    choice = r.json()["choices"][0]
    assert choice["text"] == " the quick" and choice["finish_reason"] == "stop"
    server.wait_idle()


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"prompt": "hi", "temperature": 3}, "temperature"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "n": 0}, "n"),
        ({"prompt": "hi", "n": 2, "best_of": 3}, "best_of"),
        ({"prompt": "hi", "suffix": "x"}, "suffix"),
        ({"prompt": "hi", "min_p": 0.1}, "min_p"),
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
        # int() of it would raise: never a 500
        ({"prompt": "hi", "logit_bias": {"9" * 5000: 1}}, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"\u00b2": 1}}, "logit_bias"),  # a digit to str.isdigit, not to int()
        ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
        ({"prompt": "hi", "stream": True, "stream_options": {"continuous_usage_stats": True}},
         "stream_options"),
        ({"prompt": ["a", "b", "c", "d", "e"], "n": 64}, "n"),  # 320 sequences: more than the queue's 256
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "top_k": -2}, "top_k"),
        ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "hi", "frequency_penalty": 2.5}, "frequency_penalty"),
        ({"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos"),
        ({"prompt": "hi", "include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
        ({"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),  # vLLM refuses it too
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "stop": 5}, "stop"),
        ({"prompt": "hi", "logprobs": 3}, "logprobs"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, "b"]}, "prompt"),
        ({"prompt": [[1], []]}, "prompt"),
        ({"prompt": [1, 99999999]}, "prompt"),
        ({"prompt": "hi", "max_tokens": 600}, "max_tokens"),  # over max_model_len 512
        ({"prompt": "hi " * 600, "max_tokens": 1}, "prompt"),  # the prompt alone is over 512 tokens
        ({"prompt": "hi", "stream": "yes"}, "stream"),
    ],
)
def test_bad_parameters_are_400_in_openai_shape(server, payload, param):
    _assert_openai_error(
        httpx.post(server.url + "/v1/completions", json={"model": MODEL, **payload}), 400, param
    )


def test_other_error_cases(server):
    url = server.url
    err = _assert_openai_error(
        httpx.post(url + "/v1/completions", json={"model": "gpt-4", "prompt": "x"}), 404, "model"
    )
    assert err["code"] == "model_not_found"
    _assert_openai_error(httpx.post(url + "/v1/nope", json={}), 404)
    _assert_openai_error(httpx.post(url + "/v1/completions", content=b"{not json"), 400)
    _assert_openai_error(httpx.post(url + "/v1/completions", json=[1, 2]), 400)
    # vLLM: the served model
    no_model = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert no_model.status_code == 200 and no_model.json()["model"] == MODEL
    bad_role = {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}
    _assert_openai_error(httpx.post(url + "/v1/chat/completions", json=bad_role), 400, "messages")
    _assert_openai_error(httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": []}), 400)
    # needs more KV blocks than the whole pool (64 x 16 = 1024 tokens > max_model_len 512 here, so shrink it)
    server.wait_idle()


def test_kv_pool_too_small_is_400_and_full_queue_is_503(tokenizer):
    # A holds the pool ~5.5 s: room to queue B, then C
    with Server(tokenizer, num_blocks=4, max_waiting=1, step_s=0.1) as s:
        big = {"model": MODEL, "prompt": "hello", "max_tokens": 100}  # 101 tokens > 4 x 16 slots
        err = _assert_openai_error(httpx.post(s.url + "/v1/completions", json=big), 400, "max_tokens")
        assert err["code"] == "kv_cache_too_small"
        fill = {"model": MODEL, "prompt": "hello", "max_tokens": 55, "temperature": 0, "stream": True}
        with httpx.Client(timeout=30) as c, c.stream("POST", s.url + "/v1/completions", json=fill) as a:
            lines = a.iter_lines()
            next(ln for ln in lines if ln.startswith("data: "))  # A runs and holds the whole pool
            with c.stream("POST", s.url + "/v1/completions", json=fill) as b:
                deadline = time.monotonic() + 60  # a loaded machine may take a while to queue B
                while s.health()["num_waiting"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert s.health()["num_waiting"] == 1, "B never queued behind A"
                err = _assert_openai_error(httpx.post(s.url + "/v1/completions", json=fill), 503)
                assert err["type"] == "server_overloaded"
                assert sum(ln.startswith("data: ") for ln in b.iter_lines()) == 55 + 2  # B ran after A
            assert sum(ln.startswith("data: ") for ln in lines) >= 1
        s.wait_idle()


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines, got = r.iter_lines(), 0  # keep the iterator: closing it early would close the connection
        for ln in lines:
            got += ln.startswith("data: ")
            if got == 3:
                break
        h = server.health()
        assert h["num_free_blocks"] < h["num_blocks"]  # the request holds blocks while it streams
    h = server.wait_idle()  # closed after 3 tokens: aborted, blocks back
    assert h["status"] == "ok"


def test_disconnect_while_waiting_for_a_full_answer_frees_blocks(server):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=0.3)
    server.wait_idle()


def test_official_openai_client(server, tokenizer):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=0)
    assert out.choices[0].text == tokenizer.decode(server.script[:3]) and out.usage.completion_tokens == 3
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
    )
    assert chat.choices[0].message.content == out.choices[0].text
    parts = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=3,
            temperature=0,
            stream=True,
        )
        if c.choices
    ]
    assert "".join(parts) == out.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="Hi", max_tokens=3)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, temperature=9)


def test_bench_cli_against_the_server(server, tmp_path, capsys):
    from longctx.__main__ import main

    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "--base-url",
            server.url,
            "--model",
            MODEL,
            "--num-prompts",
            "3",
            "--workload",
            "needle",
            "--prompt-tokens",
            "128",
            "--max-tokens",
            "4",
            "--concurrency",
            "2",
            "--slo-ttft-ms",
            "5000",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    assert "3 / 0 / 3" in capsys.readouterr().out
    import json

    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["completed"] == 3 and s["failed"] == 0 and s["total_output_tokens"] == 12
    assert s["answers_checked"] == 3 and s["answers_correct"] == 0  # the scripted model never says the code
    assert all(r["prompt_tokens"] <= 128 for r in doc["requests"])
    assert (
        main(["bench", "--base-url", server.url, "--model", "nope", "--num-prompts", "1"]) == 1
    )  # 404s counted
    assert (
        main(["bench", "--base-url", server.url, "--model", MODEL, "--num-prompts", "1", "--workload", "x"])
        == 2
    )


@pytest.mark.parametrize(
    ("path", "payload", "message"),
    [
        ("completions", {"prompt": "hi", "temperature": 3}, "'temperature' must be in [0.0, 2.0], got 3"),
        ("completions", {"prompt": "hi", "temperature": "x"}, "'temperature' must be a number, got 'x'"),
        ("completions", {"prompt": "hi", "top_p": 0}, "'top_p' must be in (0.0, 1.0], got 0"),
        ("completions", {"prompt": "hi", "max_tokens": True},
         "'max_tokens' must be an integer >= 1, got True"),
        ("completions", {"prompt": "hi", "n": 0}, "'n' must be an integer in [1, 64], got 0"),
        ("completions", {"prompt": "hi", "suffix": "x"},
         "'suffix' is not supported by this server (no fill-in-the-middle)"),
        ("completions", {"prompt": "hi", "stop": ["a", ""]},
         "'stop' must be a non-empty string or a list of non-empty strings"),
        ("completions", {"prompt": "hi", "n": 2, "best_of": 3},
         "'best_of' must be equal to n or left out (every sequence drawn is returned: none are ranked and "
         "dropped), got 3"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
         "'top_logprobs' must be an integer in [0, 20], with logprobs: true, got 2"),
        ("chat/completions",
         {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
         "'tools' are accepted only with tool_choice \"none\" (vLLM then leaves them out of the prompt): "
         "this server has no tool-call parser and SmolLM2's chat template has no tool calling"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
         "'tool_choice' must be \"none\" (or left out without tools): this server has no tool-call parser "
         "(SmolLM2's chat template has no tool calling)"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
         "'continue_final_message' continues the last message, so it needs add_generation_prompt: false (as "
         "vLLM says)"),
        ("completions", {"prompt": "hi", "response_format": {"type": "json_schema"}},
         "'response_format' must be {\"type\": \"text\"}: json_object and json_schema need guided decoding, "
         "which this server does not have"),
        ("completions", {"prompt": "hi", "max_tokens": 4.5}, "'max_tokens' must be an integer >= 1, got 4.5"),
        ("completions", {"prompt": "hi", "stream": "yes"}, "'stream' must be true or false, got 'yes'"),
        ("completions", {"prompt": "hi", "seed": 1.5}, "'seed' must be an integer, got 1.5"),
        ("completions", {"prompt": [1, "b"], "temperature": 9},  # the first field in order is reported
         "'prompt' must be a non-empty string, a list of token ids, or a batch of up to 256 of either "
         "(a list of strings or a list of token-id lists)"),
        ("chat/completions", {"messages": [{"role": "wizard", "content": "x"}]},
         "messages[0] needs a 'role' in ['system', 'developer', 'user', 'assistant', 'tool'], "
         "got {'role': 'wizard', 'content': 'x'}"),
        ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content: only parts of type 'text' are supported"),
        ("chat/completions", {"messages": [{"role": "user", "content": 3}]},
         "messages[0].content must be a string, a list of text parts or null, got int"),
        ("chat/completions", {"messages": []},
         "'messages' must be a non-empty list of {role, content} objects"),
    ],
)
def test_validation_messages_say_what_is_wrong_and_what_is_allowed(server, path, payload, message):
    """The request models' one validation handler keeps the messages the hand-written parser gave."""
    err = _assert_openai_error(httpx.post(f"{server.url}/v1/{path}", json={"model": MODEL, **payload}), 400)
    assert (err["message"] == message and err["code"] == "invalid_value"
            and err["type"] == "invalid_request_error")


def test_the_body_must_be_a_json_object_whatever_its_content_type(server):
    url = server.url + "/v1/completions"
    err = _assert_openai_error(httpx.post(url, content=b"{not json"), 400)
    assert err["message"].startswith("the request body is not valid JSON: Expecting property name")
    assert (_assert_openai_error(httpx.post(url, json=[1, 2]), 400)["message"]
            == "the request body must be a JSON object")
    form = httpx.post(url, content=b'{"model": "%s", "prompt": "x", "max_tokens": 2}' % MODEL.encode(),
                      headers={"content-type": "application/x-www-form-urlencoded"})  # what curl -d sends
    assert form.status_code == 200 and form.json()["usage"]["completion_tokens"] == 2


def test_nested_or_oversized_bodies_are_400_and_413_never_500(server):
    url = server.url + "/v1/completions"
    huge = b'{"prompt": "hi", "max_tokens": ' + b"9" * 5_000 + b"}"  # json.loads: over 4,300 digits
    assert "not valid JSON" in _assert_openai_error(httpx.post(url, content=huge), 400)["message"]
    seed = {"prompt": "hi", "max_tokens": 2, "temperature": 1.0, "seed": 2**64}  # overflowed manual_seed
    _assert_openai_error(httpx.post(url, json=seed), 400, "seed")
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    err = _assert_openai_error(httpx.post(url, content=deep), 400)
    assert "nested too deeply" in err["message"]
    err = _assert_openai_error(httpx.post(url, content=b" " * (33 * 2**20)), 413)
    assert err["code"] == "body_too_large"
    assert server.health()["status"] == "ok"


def test_batches_n_many_stop_strings_and_chat_roles(server, tokenizer):
    url = server.url + "/v1/completions"
    ids = tokenizer.encode("hi")
    r = httpx.post(url, json={"prompt": [ids, ids + ids], "n": 2, "max_tokens": 3}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert r["usage"] == {"prompt_tokens": 3 * len(ids), "completion_tokens": 12,
                          "total_tokens": 3 * len(ids) + 12}
    stops = ["zzz", "yyy", "xxx", "www", " brown"]  # more than OpenAI's 4, as vLLM allows
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 10, "stop": stops}).json()
    assert r["choices"][0]["text"] == " the quick" and r["choices"][0]["finish_reason"] == "stop"
    fox = tokenizer.encode(" fox")[0]
    r = httpx.post(url, json={"prompt": "hi", "max_tokens": 10, "stop_token_ids": [fox]}).json()
    assert r["choices"][0]["text"] == " the quick brown" and r["usage"]["completion_tokens"] == 4
    chat = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "What is 6 x 7?"},
            {"role": "assistant", "content": None}, {"role": "tool", "content": "42"}]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": chat, "max_tokens": 2})
    assert r.status_code == 200, r.text
    server.wait_idle()


def test_ignore_eos_generates_max_tokens(tokenizer):
    with Server(tokenizer, text=" yes<|im_end|>") as s:
        url = s.url + "/v1/completions"
        stopped = httpx.post(url, json={"prompt": "hi", "max_tokens": 8}).json()
        assert stopped["usage"]["completion_tokens"] == 2 and stopped["choices"][0]["finish_reason"] == "stop"
        full = httpx.post(url, json={"prompt": "hi", "max_tokens": 8, "ignore_eos": True}).json()
        assert full["usage"]["completion_tokens"] == 8 and full["choices"][0]["finish_reason"] == "length"
        # needs logits: a cost model has none
        refused = httpx.post(url, json={"prompt": "hi", "min_tokens": 4})
        _assert_openai_error(refused, 400, "min_tokens")


def test_tokenize_detokenize_version_and_tokenizer_info(server, tokenizer):
    url = server.url
    r = httpx.post(url + "/tokenize", json={"prompt": "hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tokenizer.encode("hello world") and r["count"] == 2 and r["max_model_len"] == 512
    assert "".join(r["token_strs"]) == "hello world"
    chat = httpx.post(url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "hello world"}
    _assert_openai_error(httpx.post(url + "/detokenize", json={"tokens": [10**9]}), 400, "tokens")
    _assert_openai_error(httpx.post(url + "/tokenize", json={}), 400, "prompt")
    # a lone surrogate (JSON may write one; no UTF-8 form): a 400, not the tokenizer's TypeError as a 500
    import json

    for path, body, param in (("/tokenize", {"prompt": "\ud800"}, "prompt"),
                              ("/v1/completions", {"prompt": "a\ud800b"}, "prompt"),
                              ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\udfff"}]},
                               "messages")):
        _assert_openai_error(httpx.post(url + path, content=json.dumps(body).encode()), 400, param)
    from longctx import __version__

    assert httpx.get(url + "/version").json() == {"version": __version__}
    info = httpx.get(url + "/tokenizer_info").json()
    assert info["eos_token"] == "<|im_end|>" and "im_start" in info["chat_template"]


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("completions", {"prompt": "hi", "guided_json": {"type": "object"}}, "guided_json"),
        ("completions", {"prompt": "hi", "truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
        ("completions", {"prompt": "hi", "length_penalty": 2.0}, "length_penalty"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
    ],
)
def test_vllms_extra_fields_not_implemented_are_refused_by_name(server, path, payload, param):
    err = _assert_openai_error(httpx.post(f"{server.url}/v1/{path}", json={"model": MODEL, **payload}), 400,
                               param)
    assert err["message"].startswith(f"'{param}' is not supported by this server")
