"""Build the server, run it, or run it in a child process (notebooks, tests, benchmarks).

- ``build_app(scheduler="chunked", token_budget=256, kv_blocks=256, ...)``: a model on our engine behind the
  OpenAI API (loads the model through ``_load_model_and_tokenizer``: torch).
- ``run_server(host, port, **build_kwargs)``: uvicorn in the foreground (``serve_app``: an app built already,
  as ``python -m longctx serve`` does after its banner).
- ``ServerProcess(**flags)``: ``python -m longctx serve`` in a child process on a free 127.0.0.1 port;
  a context manager that waits for ``/health`` and always stops the child (terminate, then kill).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from longctx.checks import positive_int

SCHEDULERS = ("monolithic", "chunked")
SMOLLM2_REFS = ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct")  # SmolLM2's names for ``--model``
DEFAULT_MODEL_REF = "HuggingFaceTB/SmolLM2-135M-Instruct"  # ``serve`` with no model: served under this name
# SmolLM2's names, accepted in any request to a server of SmolLM2
MODEL_ALIASES = ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct")


def _registry_name(model_ref: str) -> str:
    """``model_ref`` as ``longctx.model.registry`` names it (SmolLM2's Hugging Face id included)."""
    return "smollm2-135m" if model_ref in SMOLLM2_REFS else model_ref


def _load_model_and_tokenizer(model_ref: str, device, dtype, attention_backend: str):
    """The one place the server loads its model and tokenizer: ``(model, tokenizer)`` for ``model_ref``
    (``--model`` or the positional model: a registered name such as ``gemma3-270m``, SmolLM2's Hugging
    Face id, or a .gguf path) on ``device`` in ``dtype`` (torch objects, checked), attending with
    ``attention_backend``. Raises ``ValueError`` for a model this server cannot load."""
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    name = _registry_name(model_ref)
    return (load_model(device=device, dtype=dtype, attention_backend=attention_backend, model=name),
            load_tokenizer(name))


def _max_model_len(asked: int | None, model_context: int, pool_tokens: int) -> int:
    """``--max-model-len``: at most the model's context; a pool that cannot hold one request of that length
    refuses to start (vLLM's rule). Not given: the model's context, whatever the pool (the lessons serve from
    pools smaller than one context: a request the pool cannot hold is a 400 ``kv_cache_too_small``)."""
    if asked is None:
        return model_context
    positive_int("max_model_len", asked)
    if asked > model_context:
        raise ValueError(f"--max-model-len {asked} is over the model's context of {model_context} tokens")
    if asked > pool_tokens:
        raise ValueError(
            f"the KV cache pool holds {pool_tokens} tokens, fewer than one request of --max-model-len "
            f"{asked}: raise --num-gpu-blocks-override (--kv-blocks) or lower --max-model-len "
            f"(at most {pool_tokens} with this pool)")
    return int(asked)


def _blocks_for_memory(fraction: float, model, block_size: int, kv_format: str | None) -> int:
    """KV blocks that fit in ``fraction`` of the CUDA device's memory beside what is allocated already
    (the model): vLLM's ``--gpu-memory-utilization``. On a CPU there is no device memory to share: refused."""
    import torch

    from longctx.kv.quant import pool_bytes_per_token
    from longctx.memory import blocks_that_fit
    from longctx.model.device import dtype_name

    if not 0 < fraction <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {fraction}")
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError("--gpu-memory-utilization sizes the KV pool from CUDA memory; on a CPU give the "
                         "pool in blocks: --num-gpu-blocks-override (--kv-blocks)")
    free_b, total_b = torch.cuda.mem_get_info(device)
    kv_format = kv_format or dtype_name(next(model.parameters()).dtype)
    bytes_per_token = pool_bytes_per_token(model.config, kv_format)
    blocks = blocks_that_fit(fraction * total_b - (total_b - free_b), block_size, bytes_per_token)
    if blocks < 1:
        raise ValueError(f"--gpu-memory-utilization {fraction}: no room for a KV block beside the "
                         f"{(total_b - free_b) / 2**30:.2f} GiB in use")
    return blocks


def build_app(
    scheduler: str = "chunked",
    token_budget: int | None = None,
    kv_blocks: int | None = None,
    max_waiting: int | None = None,
    seed: int = 0,
    model_name: str | list[str] | None = None,
    kv_dtype: str | None = None,
    prefix_caching: bool = False,
    press: str | None = None,
    compression_ratio: float | None = None,
    model=None,
    device: str = "cpu",
    dtype: str | None = "auto",
    attention_backend: str = "auto",
    model_ref: str = DEFAULT_MODEL_REF,
    max_model_len: int | None = None,
    block_size: int = 16,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float | None = None,
    api_key: str | None = None,
    chat_template: str | None = None,
    trust_request_chat_template: bool = False,
):
    """The FastAPI app over the model ``model_ref`` names, on the engine (``scheduler``: monolithic |
    chunked; vLLM's names in brackets).

    ``model``: a loaded ``longctx.model.llama.Llama`` to serve instead of loading ``model_ref`` (tests serve a
    small random one with SmolLM2's vocabulary and tokenizer).

    ``token_budget`` (``--max-num-batched-tokens``): tokens per step (chunked: default 256; monolithic:
    default no limit, a prompt longer than it still runs alone); ``max_num_seqs``: sequences holding KV blocks
    at once; ``kv_blocks`` (``--num-gpu-blocks-override``): the pool in blocks of ``block_size`` tokens
    (default 256, or what ``gpu_memory_utilization`` of a CUDA device leaves); ``max_model_len``: prompt +
    output tokens of one request (``_max_model_len``);
    ``kv_dtype``: how the KV pool stores K and V (fp32, bf16, fp16, fp8, int8, int4; default: the model's
    dtype, fp32 on a CPU);
    ``prefix_caching``: share cached full blocks of common prefixes; ``press`` + ``compression_ratio``: prune
    each prompt's KV cache when its prefill ends (``longctx.kv.press``; not with prefix caching);
    ``device`` / ``dtype`` / ``attention_backend``: where the model runs and how it attends (``--device``,
    ``--dtype``, ``--attention-backend``: ``longctx.model.device``, ``longctx.model.attention``);
    ``model_name`` (``--served-model-name``): the name, or names, clients send (default ``model_ref``);
    ``api_key``: every ``/v1`` route needs ``Authorization: Bearer <api_key>``; ``chat_template``: a Jinja
    template (text, or a file's path) replacing the model's own; ``trust_request_chat_template``: accept a
    request's own ``chat_template``.
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    if token_budget is not None:
        positive_int("max_num_batched_tokens", token_budget)
    if kv_blocks is not None:
        positive_int("kv_blocks", kv_blocks)
    positive_int("block_size", block_size)
    if max_num_seqs is not None:
        positive_int("max_num_seqs", max_num_seqs)
    if press is not None and prefix_caching:
        raise ValueError("a press and prefix caching do not combine: "
                         "a press rewrites the blocks a cache shares")
    from longctx.engine import Engine
    from longctx.engine.pruning import press_from_options
    from longctx.engine.scheduler import DEFAULT_MAX_NUM_SEQS, ChunkedPrefillScheduler, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.hybrid import block_manager_for, kv_cache_groups
    from longctx.kv.quant import get_format
    from longctx.model.attention import choose_backend
    from longctx.model.device import resolve_placement
    from longctx.serve.app import create_app
    from longctx.serve.async_engine import AsyncEngine
    from longctx.serve.chat import ChatRenderer

    # clear errors (an unknown format, device, dtype, backend or template) before the model loads
    kv_format = None if kv_dtype is None else get_format(kv_dtype).name
    torch_device, torch_dtype = resolve_placement(device, dtype)
    choose_backend(attention_backend, torch_device, torch_dtype)
    kv_press = press_from_options(press, compression_ratio)
    seqs = max_num_seqs or DEFAULT_MAX_NUM_SEQS
    policy = (MonolithicScheduler(token_budget, seqs) if scheduler == "monolithic"
              else ChunkedPrefillScheduler(token_budget or 256, seqs))
    if model is None:
        model, tokenizer = _load_model_and_tokenizer(model_ref, torch_device, torch_dtype, attention_backend)
    else:
        from longctx.model.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(_registry_name(model_ref))
    renderer = ChatRenderer(tokenizer, chat_template, trust_request_chat_template)
    if kv_blocks is None:  # 256 blocks per KV-cache group (a hybrid model has several: longctx.kv.hybrid)
        kv_blocks = 256 * len(kv_cache_groups(model.config)) if gpu_memory_utilization is None else \
            _blocks_for_memory(gpu_memory_utilization, model, block_size, kv_format)
    pool = block_manager_for(model.config, kv_blocks, block_size, bool(prefix_caching))
    limit = _max_model_len(max_model_len, model.config.max_context, pool.capacity_tokens)
    executor = TorchExecutor(model, pool, press=kv_press, kv_dtype=kv_format,
                             attention_backend=attention_backend)
    engine = Engine(executor, policy, max_model_len=limit, eos_token_id=tokenizer.eos_token_id,
                    vocab_size=model.config.vocab_size)
    aengine = AsyncEngine(engine, max_waiting=max_waiting)
    press_label = "none" if kv_press is None else f"{press}@{compression_ratio:g}"
    names = [model_name] if isinstance(model_name, str) else list(model_name or [model_ref])
    aliases = (*names[1:], *(MODEL_ALIASES if _registry_name(model_ref) == "smollm2-135m" else ()))
    return create_app(aengine, tokenizer, names[0], aliases=aliases, base_seed=seed,
                      cache_dtype=kv_format or "auto", kv_press=press_label, api_key=api_key,
                      chat=renderer)


def serve_app(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> None:
    """Serve ``app`` until interrupted (uvicorn at ``log_level``, one process, one engine loop; each request's
    access line only at debug and trace)."""
    import uvicorn

    uvicorn.run(app, host=host, port=int(port), log_level=log_level,
                access_log=log_level in ("debug", "trace"))


def run_server(host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
               **build_kwargs) -> None:
    """``build_app(**build_kwargs)``, served until interrupted."""
    serve_app(build_app(**build_kwargs), host, port, log_level)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get_json(url: str, timeout_s: float = 5.0) -> tuple[int, dict]:
    """``(status, body)`` of a GET returning JSON (errors included), with the standard library only."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _die_with_parent() -> None:
    """In the child, on Linux: ask the kernel to SIGTERM us when the parent dies (a killed
    notebook kernel)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class ServerProcess:
    """``python -m longctx serve`` in a child process on 127.0.0.1; use as a context manager.

    Keyword arguments become flags (``scheduler="monolithic"`` -> ``--scheduler monolithic``,
    ``prefix_caching=True`` -> ``--prefix-caching``; None and False are left out). ``threads``
    sets the child's torch threads. The child's output goes to ``log_path`` (default: a temporary file whose
    tail is quoted if the server fails to start).
    """

    def __init__(
        self, startup_timeout_s: float = 180.0, threads: int | None = None, log_path=None, **flags
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.startup_timeout_s = startup_timeout_s
        self.args = [
            sys.executable,
            "-m",
            "longctx",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        for key, value in flags.items():
            flag = f"--{key.replace('_', '-')}"
            if value is True:  # a switch (prefix_caching=True -> --prefix-caching)
                self.args.append(flag)
            elif value is not None and value is not False:
                self.args += [flag, str(value)]
        if threads is not None:
            self.args += ["--threads", str(threads)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        if self.log_path is None:
            import tempfile

            self.log_path = tempfile.NamedTemporaryFile(
                prefix="longctx-serve-", suffix=".log", delete=False
            ).name
        out = open(self.log_path, "wb")  # noqa: SIM115
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.args, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
        out.close()  # the child has its own copy
        atexit.register(self.stop)  # a kernel that exits (or crashes in Python) still stops its server
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with status {self.proc.returncode} while starting: {self.args}\n"
                    f"{self.log_tail()}"
                )
            try:
                status, _ = get_json(self.base_url + "/health", timeout_s=2.0)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not answer /health within {self.startup_timeout_s} s")

    def log_tail(self, num_chars: int = 2000) -> str:
        """The end of the child's output (stdout and stderr)."""
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-num_chars:].decode("utf-8", "replace")
        except OSError:
            return ""

    def health(self) -> dict:
        return get_json(self.base_url + "/health")[1]

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` parsed with prometheus_client (``longctx.serve.prometheus.read_metrics``)."""
        from longctx.serve.prometheus import read_metrics

        return read_metrics(self.base_url)

    def stop(self) -> None:
        """Stop the child (idempotent): SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
