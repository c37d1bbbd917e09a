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
        (
            [
                "generate", "--prompt", "hi", "--max-tokens", "3", "--press", "snap", "--compression-ratio",
                "0.5",
            ],
            "unknown press 'snap'; allowed: streaming_llm, snapkv, h2o, random, knorm",
        ),
        (
            ["generate", "--prompt", "hi", "--max-tokens", "3", "--compression-ratio", "0.5"],
            "--compression-ratio needs --press NAME",
        ),
        (
            ["generate", "--prompt", "hi", "--max-tokens", "3", "--press", "knorm"],
            "--press needs --compression-ratio",
        ),
        (
            ["generate", "--prompt", "hi", "--max-tokens", "3", "--kv-dtype", "fp4"],
            "unknown kv_dtype 'fp4'; allowed",
        ),
        (
            [
                "generate", "--prompt", "hi", "--max-tokens", "3", "--prefix-caching", "--press", "knorm",
                "--compression-ratio", "0.5",
            ],
            "do not combine",
        ),
        (
            [
                "generate", "--prompt", "hi", "--max-tokens", "3", "--press", "knorm", "--compression-ratio",
                "1",
            ],
            "compression_ratio must be in [0, 1)",
        ),
        (["niah", "--lengths", "512", "--question-agnostic"], "--question-agnostic needs --press"),
    ],
)
def test_generate_rejects_bad_input_with_one_line(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


# A refusal the arguments alone decide comes before torch loads (under load, torch's import takes seconds).
TORCH_FREE_REFUSALS = [
    ["generate", "--prompt", "hi", "--max-tokens", "0"],
    ["generate", "--prompt", "hi", "--max-tokens", "3", "--kv-dtype", "fp4"],
    ["generate", "--prompt", "hi", "--max-tokens", "3", "--prefix-caching", "--press", "knorm",
     "--compression-ratio", "0.5"],
    ["niah", "--lengths", "512", "--question-agnostic"],
]


def test_the_parser_and_argument_refusals_do_not_import_torch():
    code = ("import sys\n"
            "from longctx.__main__ import build_parser, main\n"
            "build_parser()\n"
            "assert 'torch' not in sys.modules, 'building the parser imported torch'\n"
            f"for argv in {TORCH_FREE_REFUSALS!r}:\n"
            "    assert main(argv) == 2, argv\n"
            "    assert 'torch' not in sys.modules, f'refusing {argv} imported torch'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


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


@pytest.mark.slow
def test_generate_json_reports_the_blocks_a_press_frees():
    import json

    prompt = "Summarise: " + "The grass is green. The sky is blue. " * 30
    plain = run_cli("generate", "--prompt", prompt, "--max-tokens", "4", "--json")
    pressed = run_cli("generate", "--prompt", prompt, "--max-tokens", "4", "--json", "--press", "snapkv",
                      "--compression-ratio", "0.75", "--chunk-size", "64")
    assert plain.returncode == 0 and pressed.returncode == 0, plain.stderr + pressed.stderr
    a, b = json.loads(plain.stdout), json.loads(pressed.stdout)
    assert a["prompt_tokens"] == b["prompt_tokens"] > 300
    assert a["kv_blocks_after_prefill"] == a["kv_blocks_without_press"] == b["kv_blocks_without_press"]
    assert b["kv_tokens_after_prefill"] == b["prompt_tokens"] - int(0.75 * b["prompt_tokens"])
    assert (
        b["kv_blocks_after_prefill"] == -(-b["kv_tokens_after_prefill"] // 16) < a["kv_blocks_after_prefill"]
    )
    assert b["output_tokens"] >= 1 and pressed.stderr == ""


@pytest.mark.slow
def test_generate_shares_a_system_prompt_and_stores_the_pool_in_fp8():
    import json

    system = "You are a careful assistant. " + "Answer briefly and cite the rules. " * 20
    args = ["generate", "--raw", "--max-tokens", "4", "--json", "--chunk-size", "64", "--kv-dtype", "fp8",
            "--prompt", system + "Question one?", "--prompt", system + "Question two?"]
    cold = run_cli(*args)
    warm = run_cli(*args, "--prefix-caching")
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    a = [json.loads(line) for line in cold.stdout.splitlines()]
    b = [json.loads(line) for line in warm.stdout.splitlines()]
    assert len(a) == len(b) == 2 and warm.stderr == ""
    assert [r["prefix_cached_tokens"] for r in a] == [0, 0]
    assert b[0]["prefix_cached_tokens"] == 0 and b[1]["prefix_cached_tokens"] >= 128
    assert b[1]["prefix_cached_tokens"] % 16 == 0 and b[1]["prefix_cached_tokens"] < b[1]["prompt_tokens"]
    assert b[0]["kv_dtype"] == "fp8" and b[0]["kv_pool_bytes_per_token"] == 2 * 30 * 3 * (64 + 2)
    assert all(r["output_tokens"] == 4 for r in a + b)


NO_CUDA = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")


@NO_CUDA
@pytest.mark.parametrize(("args", "message"), [
    (["generate", "--prompt", "hi", "--max-tokens", "3", "--device", "cuda"], "no CUDA device is available"),
    (["niah", "--lengths", "512", "--device", "cuda:1"], "no CUDA device is available"),
    (["serve", "--device", "cuda"], "no CUDA device is available"),
    (["generate", "--prompt", "hi", "--max-tokens", "3", "--device", "gpu"],
     "--device must be cpu, cuda or cuda:N"),
])
def test_placement_errors_are_one_line_before_the_model_loads(args, message, capsys):
    from longctx.__main__ import main  # in-process: the error comes before any model or server would start

    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and len(err.strip().splitlines()) == 1, err


@NO_CUDA
def test_load_model_on_cuda_without_cuda_says_so():
    from longctx.model.weights import load_model

    with pytest.raises(ValueError, match="no CUDA device is available.*use --device cpu"):
        load_model(device="cuda")
    with pytest.raises(ValueError, match="--dtype must be one of"):
        load_model(dtype="fp64")
