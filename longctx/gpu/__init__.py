"""Measurements on a real GPU and the records they leave (``longctx/data/gpu/<device key>.json``).

- ``harness``: ``time_fn`` (CUDA events on a GPU, ``perf_counter`` on the CPU; warm-up, median of repeats).
- ``suite`` / ``sections``: ``python -m longctx gpu-bench`` (``run_suite``; ``BenchConfig.toy()`` runs on
  the CPU in seconds): one record with provenance.
- ``records``: ``load_record``, ``save_record``, ``check_record``, ``describe``.
- ``calibration``: the simulator's cost model calibrated from a record; predicted against measured steps.

The lessons' figures drawn from these records are ``longctx.lessons.gpu_cells``.

Importing this package does not import torch.
"""

from __future__ import annotations

import re


def available() -> bool:
    """True when torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def device_key(name: str) -> str:
    """A file-name key for a device name: ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` ->
    ``"h100"``, ``"cpu"`` -> ``"cpu"``; otherwise the name in lower case with ``-`` for other characters."""
    low = name.lower().replace("nvidia", " ")
    m = re.search(r"\b([a-z]{1,3}\d{1,4}[a-z]?)\b", low)
    return m.group(1) if m else re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "unknown"
