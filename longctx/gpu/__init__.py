"""Measurements on a real GPU, and the results recorded from them (``longctx/data/gpu/<device>.json``).

    from longctx import gpu
    gpu.available()            # True when torch sees a CUDA device
    gpu.device_name()          # "NVIDIA H200" (or "cpu")
    gpu.device_key()           # "h200": the file name of its record

- ``harness``: ``time_fn`` (CUDA events on a GPU, ``perf_counter`` on the CPU; warm-up, median of repeats).
- ``workloads``: random-weight Llama models at real shapes, fast attention metadata, executed FLOPs/bytes.
- ``bench``: the suite behind ``python -m longctx gpu-bench`` (``run_suite``; ``BenchConfig.toy()`` runs on
  the CPU in seconds).
- ``records``: the record's schema (``validate_record``), ``load_recorded``, ``estimate_for`` (H100 from H200).
- ``calibration``: the simulator's cost model calibrated from a record; predicted versus measured steps.
- ``cells``: figures for the lessons' GPU cells (live on CUDA, else the record, else the roofline prediction).

Importing this package does not import torch.
"""

from __future__ import annotations

import re


def available() -> bool:
    """True when torch is installed and sees at least one CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # a broken driver reads as "no GPU", never as a crash
        return False


def device_name() -> str:
    """The CUDA device's name (``"NVIDIA H200"``), or ``"cpu"`` when there is none."""
    if not available():
        return "cpu"
    import torch

    return str(torch.cuda.get_device_name(0))


def device_key(name: str | None = None) -> str:
    """A short file-name key for a device name: ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"``
    -> ``"h100"``, ``"cpu"`` -> ``"cpu"``; otherwise the name in lower case with ``-`` for other characters."""
    name = device_name() if name is None else name
    low = name.lower().replace("nvidia", " ")
    m = re.search(r"\b([a-z]{1,3}\d{1,4}[a-z]?)\b", low)
    if m:
        return m.group(1)
    slug = re.sub(r"[^a-z0-9]+", "-", low).strip("-")
    return slug or "unknown"


__all__ = ["available", "device_key", "device_name"]
