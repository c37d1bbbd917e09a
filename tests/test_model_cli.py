"""``python -m longctx fetch-model`` and ``generate``: exit codes, one-line errors, output."""

import subprocess
import sys

import pytest


def run_cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "longctx", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--prompt", "hi", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["generate", "--prompt", "   ", "--max-tokens", "3"], "the prompt is empty"),
        (["generate", "--prompt", "hi", "--max-tokens", "3", "--chunk-size", "0"], "--chunk-size"),
        (["generate", "--prompt-file", "/nonexistent/p.txt", "--max-tokens", "3"], "cannot read"),
        (["generate", "--max-tokens", "3"], "one of the arguments --prompt --prompt-file is required"),
    ],
)
def test_generate_rejects_bad_input_with_one_line(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


@pytest.mark.slow
def test_fetch_model_is_idempotent_and_generate_prints_a_completion(tmp_path):
    first = run_cli("fetch-model")
    assert first.returncode == 0 and "cached in" in first.stdout and first.stderr == ""
    second = run_cli("fetch-model")
    assert second.returncode == 0 and "already cached" in second.stdout
    prompt = tmp_path / "p.txt"
    prompt.write_text("What is the capital of France?")
    res = run_cli("generate", "--prompt-file", str(prompt), "--max-tokens", "8", "--chunk-size", "5")
    assert res.returncode == 0 and res.stderr == ""
    assert "Paris" in res.stdout
    raw = run_cli("generate", "--prompt", "The capital of France is", "--max-tokens", "3", "--raw")
    assert raw.returncode == 0 and raw.stdout.strip()
