"""Results recorded once and shipped with the course: ``longctx/data/recorded/*.json`` (CPU benchmarks and
simulator sweeps, written by ``benchmarks/``) and ``longctx/data/gpu/<device>.json`` (``make gpu-bench``).

One loader for all of them: ``load_recorded(name)`` returns the parsed JSON and raises ``ValueError``
saying which file is missing or broken and what writes it. ``recorded_path`` answers whether one exists.
"""

from __future__ import annotations

import json
import pathlib
from importlib import resources

FOLDERS = {"recorded": "benchmarks/ (see the file's benchmark)", "gpu": "make gpu-bench on a GPU"}


def recorded_path(name: str, folder: str = "recorded") -> pathlib.Path:
    """Where the recorded file ``name`` lives (``folder``: ``"recorded"`` or ``"gpu"``), existing or not."""
    if folder not in FOLDERS:
        raise ValueError(f"unknown folder {folder!r}; allowed: {', '.join(FOLDERS)}")
    return pathlib.Path(str(resources.files("longctx"))) / "data" / folder / name


def load_recorded(name: str = "sim_capacity.json", folder: str = "recorded",
                  path: str | pathlib.Path | None = None) -> dict:
    """The recorded JSON ``name`` from ``longctx/data/<folder>/``, or the file at ``path``."""
    path = recorded_path(name, folder) if path is None else pathlib.Path(path)
    if not path.is_file():
        raise ValueError(
            f"no recorded result {path.name!r} in {path.parent}; it is written by {FOLDERS[folder]}"
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
