"""Where a recorded number comes from, read once for every recording script: the code's commit (and whether
the tree had uncommitted changes), the processor or GPU, the software, and the output of a short command.

``benchmarks/*.py`` and ``longctx.gpu`` build their records' ``provenance`` from these, and every script that
records a measurement calls ``load_gate`` first: it refuses to record on a machine whose one-minute load
average is above the cores the run uses; ``wait_for_quiet`` pauses between its measurements while others load
it.
"""

from __future__ import annotations

import os
import pathlib
import platform
import re
import subprocess
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent


def first_line(args: list[str], cwd: str | pathlib.Path = _HERE, timeout_s: float = 20) -> str | None:
    """The first line ``args`` prints, or None when the command is missing, fails or prints nothing."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text.splitlines()[0] if out.returncode == 0 and text else None


def git_commit(short: bool = True) -> str | None:
    """This checkout's commit (``$LONGCTX_COMMIT`` when set, for a copy of the tree without ``.git``)."""
    return os.environ.get("LONGCTX_COMMIT") or first_line(
        ["git", "rev-parse", *(["--short"] if short else []), "HEAD"])


def git_dirty() -> bool | None:
    """Whether tracked files differ from the commit; None outside a git checkout."""
    if first_line(["git", "rev-parse", "HEAD"]) is None:
        return None
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=20,
        cwd=_HERE,
    )
    return bool(out.stdout.strip())


def load_gate(threads: int, force: bool = False) -> float:
    """The one-minute load average; exits with status 3 and says why when it exceeds ``threads`` (the cores
    the run uses), unless ``force`` (a dry run: its record should be marked unusable)."""
    load = os.getloadavg()[0]
    if load > threads and not force:
        print(
            f"refusing to record: the one-minute load average is {load:.2f}, above the {threads} core(s) "
            "this "
            f"run uses (other work would distort the timings). Wait for a quiet machine (see `uptime`), "
            "or "
            f"pass --force for a dry run whose record is marked unusable.",
            file=sys.stderr,
        )
        raise SystemExit(3)
    return load


def wait_for_quiet(threads: int, force: bool = False, poll_s: float = 30.0) -> float:
    """Between a run's measurements: pause while other work's load (the load minus this run's own
    ``threads``) exceeds ``threads``; returns the load it went on at."""
    while True:
        load = os.getloadavg()[0]
        if force or load - threads <= threads:
            return load
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} paused: load {load:.2f} (others ~{load - threads:.2f} > "
              f"{threads})", file=sys.stderr, flush=True)
        time.sleep(poll_s)


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """``"<cpu>, <n> cores (shared), <platform>"``: the line a record's ``machine`` field carries."""
    return f"{cpu_name()}, {os.cpu_count()} cores (shared), {platform.platform()}"


def device_key(name: str) -> str:
    """A file-name key: ``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``, ``"cpu"`` -> ``"cpu"``; otherwise the
    name in lower case with ``-`` for other characters."""
    low = name.lower().replace("nvidia", " ")
    m = re.search(r"\b([a-z]{1,3}\d{1,4}[a-z]?)\b", low)
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "unknown"


def device_provenance(device) -> dict:
    """A torch device's provenance: name and file key (``device_key``), torch, CUDA,
    driver, memory, multiprocessors, the processor, Python and the code's commit."""
    import torch

    info = {"name": "cpu", "torch": torch.__version__, "cuda": torch.version.cuda, "driver": None,
            "python": platform.python_version(), "commit": git_commit(short=False), "processor": cpu_name()}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(
            name=p.name, memory_bytes=int(p.total_memory), multiprocessors=int(p.multi_processor_count),
            capability=f"{p.major}.{p.minor}",
            driver=first_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        )
    return {**info, "key": device_key(info["name"])}
