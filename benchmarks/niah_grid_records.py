"""The record format of ``benchmarks/niah_grid.py``, which ``kv_pruning.py``, ``serving.py`` and
``capstone.py`` share (through ``niah_grid``): ``{"meta", "rows"}`` written atomically with one row per line
(``write_record``), reopened with this run's provenance appended to ``meta.runs`` (``open_record``, a new
record when older than ``RECORD_VERSION``), the trials' seeds (``trial_seed``) and what makes a row one
trial (``trial_key``), and the ``merge`` section's join of records recorded in parallel (``merge_records``).
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def trial_seed(length: int, depth: float, i: int) -> int:
    """The seed of trial ``i`` (< 100) of cell (length, depth): its own needle value and filler."""
    if not 0 <= int(i) < 100:
        raise ValueError(f"at most 100 trials per cell, got trial {i}")
    return int(length) * 10_000 + round(float(depth) * 100) * 100 + int(i)


def write_record(path: Path, data: dict) -> None:
    """``{"meta", "rows"}`` with one row per line (readable diffs), ``meta.n`` = rows, written atomically."""
    data["meta"]["n"] = len(data["rows"])
    data["meta"]["finished"] = now()
    rows = ",\n".join(json.dumps(r, separators=(",", ":")) for r in data["rows"])
    text = '{"meta": ' + json.dumps(data["meta"], indent=1) + ',\n"rows": [\n' + rows + "\n]}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


RECORD_VERSION = 2  # independent trials, containment scoring, load-gated; version 1 files are replaced


def open_record(path: Path, meta: dict) -> dict:
    """The record at ``path`` with this run's provenance appended to ``meta.runs``; a new one when absent or
    older than ``RECORD_VERSION`` (its rows were made otherwise; git history keeps them)."""
    if path.exists():
        data = json.loads(path.read_text())
        if data.get("meta", {}).get("record_version") == RECORD_VERSION:
            runs = data["meta"].setdefault("runs", [])
            runs.append(meta)
            data["meta"]["usable"] = all(r.get("usable", True) for r in runs)
            return data
        print(f"{path.name}: replacing a record of an older version (git history keeps it)", file=sys.stderr)
    return {"meta": {**meta, "record_version": RECORD_VERSION, "runs": [meta]}, "rows": []}


def trial_key(row: dict) -> tuple:
    """What makes a recorded row one trial: its haystack, RoPE variant (or depth-1 variant), length, depth and
    seed (fields a section does not have are None). A rerun skips, and ``merge`` refuses a second copy of, a
    key."""
    return (
        row.get("haystack"), row.get("rope", row.get("variant")), row["length"], row.get("depth"),
        row["seed"],
    )


def merge_records(paths: list[Path], out: Path) -> dict:
    """One record from several of the same section and version: their rows (a trial recorded twice is an
    error)
    and every run's provenance; ``usable`` only if every input is."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    versions = {d["meta"].get("record_version") for d in parts}
    if versions != {RECORD_VERSION}:
        raise SystemExit(
            f"merge: every input must be a version-{RECORD_VERSION} record, got versions "
            f"{sorted(map(str, versions))}"
        )
    rows, seen = [], set()
    for d in parts:
        for r in d["rows"]:
            if trial_key(r) in seen:
                raise SystemExit(f"merge: trial {trial_key(r)} is in more than one input")
            seen.add(trial_key(r))
            rows.append(r)
    runs = [run for d in parts for run in d["meta"].get("runs", [d["meta"]])]
    first = min(runs, key=lambda run: run["date"])
    meta = {**parts[0]["meta"], **first, "runs": runs,
            "usable": all(d["meta"].get("usable", True) for d in parts)}
    data = {"meta": meta, "rows": rows}
    write_record(out, data)
    return data
