"""The server with the capstone's KV features, fast: `build_app` (the serving path `python -m longctx serve`
uses) over a small random-weight Llama with SmolLM2's vocabulary and real tokenizer, in a uvicorn thread.
A KV press prunes through the server and frees blocks (seen in /metrics); a second request with the same
long system prompt hits the prefix cache (seen in /metrics, official openai client); /metrics parses with
prometheus_client's parser and names its metrics as vLLM does. The real SmolLM2 in a child process:
tests/test_server_capstone.py."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from longctx.kv.block_manager import blocks_for_tokens
from longctx.kv.press import make_press
from longctx.serve.launch import build_app, free_port
from longctx.serve.prometheus import parse_metrics

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
BS = 16
M = "vllm:"


@pytest.fixture(scope="module")
def tokenizer():
    from longctx.model.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def tiny(tokenizer):
    from longctx.model.llama import Llama
    from longctx.specs import ModelSpec

    spec = ModelSpec(name="tiny-smollm2-vocab", num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                     head_dim=8, source="test", intermediate_size=48, vocab_size=tokenizer.vocab_size,
                     rope_theta=10000.0, max_context=2048)
    return Llama(spec).init_random_(seed=3, std=0.3).eval()


class Served:
    """``build_app(**flags)`` served by uvicorn in a thread on a free port."""

    def __init__(self, **flags):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = build_app(**flags)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url + "/metrics").text)


def _long_text(tokenizer, num_tokens, seed=0):
    from longctx.bench.workloads import filler_text

    return filler_text(num_tokens, tokenizer, seed)


def test_metrics_parse_with_prometheus_client_and_use_vllms_names(tiny):
    with Served(model=tiny, kv_blocks=64) as s:
        r = httpx.get(s.url + "/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
    gauges = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "kv_cache_used_blocks",
              "kv_cache_total_blocks", "cache_config_info"}
    counters = {"prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens",
                "generation_tokens", "kv_press_evicted_tokens", "kv_press_freed_blocks", "request_success"}
    histograms = {"time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                  "request_time_per_output_token_seconds", "request_queue_time_seconds",
                  "request_inference_time_seconds", "request_prefill_time_seconds",
                  "request_decode_time_seconds",
                  "request_prompt_tokens", "request_generation_tokens", "request_params_max_tokens",
                  "iteration_tokens_total"}
    assert ({n for n in families if not n.endswith("_created")}
            == {M + n for n in gauges | counters | histograms})
    assert all(families[M + n].type == "histogram" for n in histograms)
    assert all(families[M + n].type == "gauge" for n in gauges)
    assert all(families[M + n].type == "counter" for n in counters)
    assert families[M + "kv_cache_total_blocks"].samples[0].value == 64
    assert families[M + "kv_cache_total_blocks"].samples[0].labels == {"model_name": MODEL, "engine": "0"}
    info = families[M + "cache_config_info"].samples[0].labels
    assert info["num_gpu_blocks"] == "64" and info["block_size"] == "16" and info["cache_dtype"] == "auto"


def test_a_press_prunes_through_the_server_and_frees_blocks(tiny, tokenizer):
    press = make_press("snapkv", 0.5)
    prompt = _long_text(tokenizer, 300)
    n_prompt = len(tokenizer.encode(prompt))
    kept = press.num_kept(n_prompt)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "stream": True}
    with Served(model=tiny, kv_blocks=64, press="snapkv", compression_ratio=0.5) as s:
        during = []
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and len(during) < 5:
                    during.append(s.metrics())  # while the request decodes (its prefill is done)
        after = s.metrics()
    running = [m for m in during if m[M + "num_requests_running"] == 1]
    assert running, "no scrape saw the request running"
    for m in running:
        # At the scrape's decode progress (g tokens generated; the engine may step once more between the
        # counter and the gauge), the pruned request holds the kept tokens' blocks, which are fewer than
        # the whole prompt's plus the same g. A scrape that comes late on a busy machine only raises g.
        g = int(m[M + "generation_tokens_total"])
        assert m[M + "kv_cache_used_blocks"] <= blocks_for_tokens(kept + g + 2, BS)
        assert m[M + "kv_cache_used_blocks"] < blocks_for_tokens(n_prompt + g, BS)
    assert after[M + "kv_press_evicted_tokens_total"] == n_prompt - kept
    assert (after[M + "kv_press_freed_blocks_total"]
            == blocks_for_tokens(n_prompt, BS) - blocks_for_tokens(kept, BS))
    assert after[M + "kv_cache_used_blocks"] == 0 and after[M + "num_requests_running"] == 0
    assert after[M + "prompt_tokens_total"] == n_prompt


def test_without_a_press_the_server_frees_nothing_early(tiny, tokenizer):
    prompt = _long_text(tokenizer, 300)
    with Served(model=tiny, kv_blocks=64) as s:
        out = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 3,
                                                          "temperature": 0}, timeout=60).json()
        m = s.metrics()
    assert out["usage"]["completion_tokens"] == 3
    assert m[M + "kv_press_freed_blocks_total"] == 0 and m[M + "generation_tokens_total"] == 3


def test_a_short_prompt_for_the_press_window_is_a_400(tiny):
    with Served(model=tiny, kv_blocks=64, press="snapkv", compression_ratio=0.5) as s:
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and "window" in err["message"]


def test_a_second_request_with_the_same_system_prompt_hits_the_prefix_cache(tiny, tokenizer):
    import openai

    system = {"role": "system", "content": _long_text(tokenizer, 300, seed=1)}
    convs = [[system, {"role": "user", "content": q}] for q in ("What is a river?", "Name a colour.")]
    ids = [tokenizer.encode_chat(c) for c in convs]
    common = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    with Served(model=tiny, kv_blocks=96, kv_dtype="fp8", prefix_caching=True) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
        seen = []
        for conv in convs:
            chat = client.chat.completions.create(model=MODEL, messages=conv, max_tokens=4, temperature=0)
            assert chat.usage.completion_tokens >= 1
            seen.append(s.metrics())
        info = next(f for f in text_string_to_metric_families(httpx.get(s.url + "/metrics").text)
                    if f.name == M + "cache_config_info").samples[0].labels
    assert info["cache_dtype"] == "fp8" and info["enable_prefix_caching"] == "True"
    first, second = seen
    assert first[M + "prefix_cache_hits_total"] == 0
    assert first[M + "prefix_cache_queries_total"] == len(ids[0])
    assert second[M + "prefix_cache_queries_total"] == len(ids[0]) + len(ids[1])
    assert second[M + "prefix_cache_hits_total"] == (common // BS) * BS > 0  # the system prompt's full blocks


def test_seeded_sampling_through_the_server_is_reproducible_and_greedy_is_argmax(tiny):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12}
    with Served(model=tiny, kv_blocks=64) as s:
        def text(**kw):
            return httpx.post(s.url + "/v1/completions", json={**body, **kw},
                              timeout=60).json()["choices"][0]["text"]

        a, b, c = text(temperature=1.0, seed=7), text(temperature=1.0, seed=7), text(temperature=1.0, seed=8)
        greedy = text(temperature=0)
    assert a == b and a != c and greedy != a


def test_serve_flags_and_vllm_spellings_parse():
    from longctx.__main__ import build_parser

    p = build_parser()
    ours = p.parse_args(["serve", "--kv-dtype", "fp8", "--prefix-caching"])
    vllm = p.parse_args(["serve", "--kv-cache-dtype", "fp8", "--enable-prefix-caching"])
    assert (ours.kv_dtype, ours.prefix_caching) == (vllm.kv_dtype, vllm.prefix_caching) == ("fp8", True)
    pressed = p.parse_args(["serve", "--press", "snapkv", "--compression-ratio", "0.5"])
    assert (pressed.press, pressed.compression_ratio) == ("snapkv", 0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kv-dtype", "fp7"], "unknown kv_dtype"),
        (["--press", "snapkv"], "--compression-ratio"),
        (["--compression-ratio", "0.5"], "--press"),
        (["--press", "snapkv", "--compression-ratio", "0.5", "--prefix-caching"], "do not combine"),
        (["--press", "nope", "--compression-ratio", "0.5"], "unknown press"),
    ],
)
def test_bad_serve_flags_are_one_line_errors_before_the_model_loads(argv, message, capsys):
    from longctx.__main__ import main

    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_shared_prefix_workload_hits_the_servers_prefix_cache(tiny, tokenizer, tmp_path, capsys):
    """`bench --workload shared-prefix --prefix-tokens N`: one common system prompt, distinct questions; on a
    server with prefix caching every request after the first finds the system prompt's full blocks cached."""
    import json

    from longctx.__main__ import main
    from longctx.bench.workloads import build_workload

    reqs = build_workload("shared-prefix", 4, tokenizer, prefix_tokens=256, max_tokens=2)
    assert len({r["messages"][1]["content"] for r in reqs}) == 4  # distinct questions
    assert len({r["messages"][0]["content"] for r in reqs}) == 1 and reqs[0]["prefix_tokens"] <= 256
    ids = [tokenizer.encode_chat(r["messages"]) for r in reqs]
    common = min(next(i for i, (a, b) in enumerate(zip(ids[0], x, strict=False)) if a != b) for x in ids[1:])
    assert common >= reqs[0]["prefix_tokens"]
    out = tmp_path / "bench.json"
    with Served(model=tiny, kv_blocks=128, prefix_caching=True) as s:
        argv = ["bench", "--base-url", s.url, "--model", MODEL, "--num-prompts", "4",
                "--workload", "shared-prefix",
                "--prefix-tokens", "256", "--max-tokens", "2", "--concurrency", "1", "--json", str(out)]
        assert main(argv) == 0
        m = s.metrics()
    doc = json.loads(out.read_text())
    assert doc["summary"]["completed"] == 4 and doc["summary"]["answers_checked"] == 4
    assert m[M + "prefix_cache_hits_total"] == 3 * (common // BS) * BS  # one at a time: 3 requests hit
    assert "4 / 0 / 4" in capsys.readouterr().out


def test_prefix_tokens_belongs_to_the_shared_prefix_workload(tokenizer, capsys):
    from longctx.__main__ import main
    from longctx.bench.workloads import build_workload

    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--model", MODEL, "--num-prompts", "1"]
    assert main([*argv, "--workload", "chat", "--prefix-tokens", "64"]) == 2
    assert "--prefix-tokens applies to --workload shared-prefix only" in capsys.readouterr().err
    with pytest.raises(ValueError, match="notes alone"):
        build_workload("shared-prefix", 2, tokenizer, prefix_tokens=20)
    with pytest.raises(ValueError, match="not prompt_tokens"):
        build_workload("shared-prefix", 2, tokenizer, prompt_tokens=200)


def test_per_request_series_as_vllm_observes_them(tiny, tokenizer):
    with Served(model=tiny, kv_blocks=64) as s:
        before = s.metrics()
        prompt = _long_text(tokenizer, 40)
        n_prompt = len(tokenizer.encode(prompt))
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 5,
                                                         "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200
        after = s.metrics()
        text = httpx.get(s.url + "/metrics").text
    labels = f'engine="0",finished_reason="length",model_name="{MODEL}"'
    assert f"vllm:request_success_total{{{labels}}} 1.0" in text
    for name in ("queue", "inference", "prefill", "decode"):
        assert after[f"{M}request_{name}_time_seconds_count"] == 1
    assert after[M + "request_prompt_tokens_sum"] == n_prompt
    assert after[M + "request_generation_tokens_sum"] == 5 and after[M + "request_params_max_tokens_sum"] == 5
    steps = after[M + "iteration_tokens_total_count"] - before.get(M + "iteration_tokens_total_count", 0)
    assert steps >= 5 and after[M + "iteration_tokens_total_sum"] == n_prompt + 4  # the last token: no step
    decode = after[M + "request_decode_time_seconds_sum"]
    inference = after[M + "request_inference_time_seconds_sum"]
    assert 0 < decode < inference <= after[M + "e2e_request_latency_seconds_sum"]
