"""Real clients, unchanged, against `python -m longctx serve` on 127.0.0.1 (the real SmolLM2): the
lm-evaluation-harness and guidellm versions pinned in requirements-clients.txt, run as their CLIs, as a user
who evaluates and benchmarks vLLM runs them. No download: the tasks are local files (tests/data/lm_eval),
lm-eval tokenizes through the server's /tokenizer_info and /tokenize (its remote tokenizer, chosen by
default), and guidellm's tokenizer is the model's own tokenizer.json in a folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.serve.launch import ServerProcess

pytestmark = pytest.mark.slow
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TASKS = Path(__file__).parent / "data" / "lm_eval"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "TQDM_DISABLE": "1"}


@pytest.fixture(scope="module")
def server():
    with ServerProcess(kv_blocks=128, threads=2) as s:
        yield s


def _run(cmd: list[str], cwd: Path, timeout_s: float = 400) -> None:
    p = subprocess.run(cmd, cwd=cwd, env=dict(os.environ, **OFFLINE), capture_output=True, text=True,
                       timeout=timeout_s)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def test_lm_eval_local_completions_generate_until_and_multiple_choice(server, tmp_path):
    _run([sys.executable, "-m", "lm_eval", "--model", "local-completions",
          "--model_args", f"model={MODEL},base_url={server.base_url}/v1/completions",
          "--tasks", "longctx_capitals_gen,longctx_capitals_mc", "--include_path", str(TASKS),
          "--output_path", str(tmp_path), "--log_samples"], cwd=TASKS)
    (results,) = tmp_path.glob("*/results_*.json")
    res = json.loads(results.read_text())["results"]
    assert res["longctx_capitals_gen"]["sample_len"] == 8 and res["longctx_capitals_mc"]["sample_len"] == 8
    assert res["longctx_capitals_mc"]["acc,none"] == 1.0  # eight easy capitals, scored by log-probability
    assert res["longctx_capitals_gen"]["exact_match,none"] >= 0.75
    (mc,) = tmp_path.glob("*/samples_longctx_capitals_mc_*.jsonl")
    for line in mc.read_text().splitlines():
        sample = json.loads(line)
        scores = [r[0] for r in sample["resps"]]  # (log-likelihood, is_greedy) per choice
        assert len(scores) == 4 and all(float(lp) < 0 for lp, _greedy in scores)
    (gen,) = tmp_path.glob("*/samples_longctx_capitals_gen_*.jsonl")
    answers = [json.loads(line)["resps"][0][0] for line in gen.read_text().splitlines()]
    assert all(a and "\n" not in a and "." not in a for a in answers)  # cut at the task's stop strings
    assert server.health()["num_free_blocks"] == server.health()["num_blocks"]


def test_guidellm_synchronous_run_with_ignore_eos(server, tmp_path):
    from longctx.model.weights import fetch_model

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_bytes((fetch_model() / "tokenizer.json").read_bytes())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "model_max_length": 8192}))
    report = tmp_path / "report.json"
    _run([sys.executable, "-m", "guidellm", "run", "--backend", f"kind=openai_http,target={server.base_url}",
          "--profile", "kind=synchronous", "--constraint", "kind=max_requests,count=4",
          "--data", "kind=synthetic_text,prompt_tokens=16,output_tokens=8",
          "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={report}",
          "--disable-console-interactive"], cwd=tmp_path)
    (bench,) = json.loads(report.read_text())["benchmarks"]
    requests = bench["requests"]
    assert len(requests["successful"]) == 4 and not requests["errored"] and not requests["incomplete"]
    for r in requests["successful"]:
        body = json.loads(r["request_args"])["body"]
        assert body["ignore_eos"] is True and body["stream_options"]["continuous_usage_stats"] is True
        assert r["output_tokens"] == body["max_completion_tokens"] == 8
