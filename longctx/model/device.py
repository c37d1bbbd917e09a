"""Where the real model runs: ``--device`` (cpu, cuda, cuda:N) and ``--dtype`` (auto, fp32, bf16, fp16),
checked once.

``resolve_placement`` turns the two strings into a ``torch.device`` and a ``torch.dtype`` or raises a
``ValueError`` in one line that says what is wrong and what is allowed (the CLI prints it as ``error: …``).
``auto`` is fp32 on a CPU (the lessons' exact numbers) and bf16 on CUDA (what the fused attention backend
serves, ``longctx.model.attention``).
"""

from __future__ import annotations

import re

import torch

from longctx.model.choices import DTYPE_CHOICES, DTYPE_NAMES

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?")


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a ``torch.device``; CUDA must be present (and N a real device)."""
    if not isinstance(name, str) or not _DEVICE_RE.fullmatch(name):
        raise ValueError(f"--device must be cpu, cuda or cuda:N; got {name!r}")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(
                f"--device {name}: no CUDA device is available (torch {torch.__version__}, {build}); "
                "use --device cpu"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(
                f"--device {name}: this machine has {count} CUDA device(s), cuda:0 … cuda:{count - 1}"
            )
    return device


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """``auto`` (or None): fp32 on a CPU, bf16 on CUDA; else one of fp32, bf16, fp16."""
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}; got {name!r}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``bf16`` (the names ``--dtype`` and ``--kv-dtype`` use)."""
    return next(n for n, t in DTYPES.items() if t == dtype)


def resolve_placement(device: str = "cpu", dtype: str | None = "auto") -> tuple[torch.device, torch.dtype]:
    """``(torch.device, torch.dtype)`` for ``--device`` and ``--dtype``, checked."""
    dev = resolve_device(device)
    return dev, resolve_dtype(dtype, dev)
