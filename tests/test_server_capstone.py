"""`python -m longctx serve` with the capstone's KV choices, on the real SmolLM2 in a child process:
`--kv-cache-dtype fp8 --enable-prefix-caching` (vLLM's spellings of --kv-dtype / --prefix-caching) and
`--press snapkv --compression-ratio 0.5`. Seen from outside as a client and a Prometheus scraper would:
the official openai client, and /metrics parsed with prometheus_client. Fast versions over a tiny model:
tests/test_server_metrics.py."""

from __future__ import annotations

import httpx
import pytest

from longctx.kv.block_manager import blocks_for_tokens
from longctx.kv.press import make_press
from longctx.serve.launch import ServerProcess

pytestmark = pytest.mark.slow
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
M = "vllm:"


def _tokenizer():
    from model_fixtures import our_tokenizer

    return our_tokenizer()


def test_fp8_kv_and_prefix_caching_serve_and_a_second_request_hits_the_cache():
    import openai

    from longctx.bench.workloads import build_workload

    tok = _tokenizer()
    reqs = build_workload("shared-prefix", 2, tok, prefix_tokens=600, max_tokens=8)
    ids = [tok.encode_chat(r["messages"]) for r in reqs]
    common = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    with ServerProcess(kv_cache_dtype="fp8", enable_prefix_caching=True, kv_blocks=256, threads=2) as s:
        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="none")
        seen = []
        for r in reqs:
            chat = client.chat.completions.create(model=MODEL, messages=r["messages"], max_tokens=8,
                                                  temperature=0)
            assert chat.usage.prompt_tokens == r["prompt_tokens"] and chat.choices[0].message.content
            seen.append(s.metrics())
        text = httpx.get(s.base_url + "/metrics").text
    assert 'cache_dtype="fp8"' in text and 'enable_prefix_caching="True"' in text
    assert seen[0][M + "prefix_cache_hits_total"] == 0
    assert seen[1][M + "prefix_cache_hits_total"] == (common // 16) * 16 >= 576  # the system prompt's blocks
    assert seen[1][M + "prompt_tokens_total"] == sum(len(x) for x in ids)


def test_a_snapkv_press_prunes_through_the_server_and_frees_blocks():
    from longctx.bench.workloads import filler_text

    tok = _tokenizer()
    prompt = filler_text(600, tok, seed=2)
    n_prompt, kept = len(tok.encode(prompt)), make_press("snapkv", 0.5).num_kept(len(tok.encode(prompt)))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": True}
    with ServerProcess(press="snapkv", compression_ratio=0.5, kv_blocks=256, threads=2) as s:
        during = []
        with httpx.stream("POST", s.base_url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and len(during) < 3:
                    during.append(s.metrics())
        after = s.metrics()
    running = [m for m in during if m[M + "num_requests_running"] == 1]
    assert running, "no scrape saw the request running"
    assert all(m[M + "kv_cache_used_blocks"] <= blocks_for_tokens(kept + 40, 16) for m in running)
    assert all(m[M + "kv_cache_used_blocks"] < blocks_for_tokens(n_prompt, 16) for m in running)
    assert after[M + "kv_press_evicted_tokens_total"] == n_prompt - kept
    assert (after[M + "kv_press_freed_blocks_total"]
            == blocks_for_tokens(n_prompt, 16) - blocks_for_tokens(kept, 16))
