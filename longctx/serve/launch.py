"""Build the server, run it, or run it in a child process (notebooks, tests, benchmarks).

- ``build_app(scheduler="chunked", token_budget=256, kv_blocks=256, ...)``: SmolLM2 on our engine behind the
  OpenAI API (loads the model: torch).
- ``run_server(host, port, **build_kwargs)``: uvicorn in the foreground (``python -m longctx serve``).
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


def build_app(
    scheduler: str = "chunked",
    token_budget: int = 256,
    kv_blocks: int = 256,
    max_waiting: int = 256,
    seed: int = 0,
    model_name: str | None = None,
    kv_dtype: str | None = None,
    prefix_caching: bool = False,
    press: str | None = None,
    compression_ratio: float | None = None,
    model=None,
    device: str = "cpu",
    dtype: str | None = "auto",
    attention_backend: str = "auto",
):
    """The FastAPI app over SmolLM2-135M-Instruct on the engine (``scheduler``: monolithic | chunked).

    ``model``: a loaded ``longctx.model.llama.Llama`` to serve instead of loading SmolLM2 (tests serve a
    small random one with SmolLM2's vocabulary and tokenizer).

    ``kv_dtype``: how the KV pool stores K and V (fp32, bf16, fp16, fp8, int8, int4; default: the model's
    dtype, fp32 on a CPU);
    ``prefix_caching``: share cached full blocks of common prefixes; ``press`` + ``compression_ratio``: prune
    each prompt's KV cache when its prefill ends (``longctx.kv.press``; not with prefix caching);
    ``device`` / ``dtype`` / ``attention_backend``: where SmolLM2 runs and how it attends (``--device``,
    ``--dtype``, ``--attention-backend``: ``longctx.model.device``, ``longctx.model.attention``).
    """
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    positive_int("token_budget", token_budget)
    positive_int("kv_blocks", kv_blocks)
    if press is not None and prefix_caching:
        raise ValueError("a press and prefix caching do not combine: "
                         "a press rewrites the blocks a cache shares")
    from longctx.engine import build_engine
    from longctx.engine.pruning import press_from_options
    from longctx.engine.scheduler import ChunkedPrefillScheduler, MonolithicScheduler
    from longctx.kv.quant import get_format
    from longctx.model.attention import choose_backend
    from longctx.model.device import resolve_placement
    from longctx.serve.app import DEFAULT_MODEL_NAME, create_app
    from longctx.serve.async_engine import AsyncEngine

    # clear errors (an unknown format, device, dtype or backend) before the model loads
    kv_format = None if kv_dtype is None else get_format(kv_dtype).name
    torch_device, torch_dtype = resolve_placement(device, dtype)
    choose_backend(attention_backend, torch_device, torch_dtype)
    kv_press = press_from_options(press, compression_ratio)
    policy = (
        MonolithicScheduler() if scheduler == "monolithic" else ChunkedPrefillScheduler(int(token_budget))
    )
    engine, tokenizer = build_engine(policy, num_blocks=int(kv_blocks), kv_dtype=kv_format, model=model,
                                     enable_prefix_caching=bool(prefix_caching), press=kv_press,
                                     device=torch_device, dtype=torch_dtype,
                                     attention_backend=attention_backend)
    aengine = AsyncEngine(engine, max_waiting=max_waiting)
    press_label = "none" if kv_press is None else f"{press}@{compression_ratio:g}"
    return create_app(aengine, tokenizer, model_name or DEFAULT_MODEL_NAME, base_seed=seed,
                      cache_dtype=kv_format or "auto", kv_press=press_label)


def run_server(host: str = "127.0.0.1", port: int = 8000, **build_kwargs) -> None:
    """Serve until interrupted (uvicorn, one process, one engine loop)."""
    import uvicorn

    app = build_app(**build_kwargs)
    uvicorn.run(app, host=host, port=int(port), log_level="warning", access_log=False)


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
