"""``NiahTable``: a tidy table (one row per trial, plain dicts) that filters, pivots, saves and loads.

No pandas needed: rows are JSON-able dicts, so a table crosses any process boundary as plain data and
``pandas.DataFrame(table.rows)`` works where pandas is installed. The JSON file keeps the rows with the
run's provenance (date, machine, torch version, git commit) in ``meta``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


class NiahTable:
    def __init__(self, rows: list[dict] | None = None, meta: dict | None = None) -> None:
        self.rows: list[dict] = [dict(r) for r in rows or ()]
        self.meta: dict = dict(meta or {})

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"NiahTable({len(self.rows)} rows, columns={self.columns})"

    @property
    def columns(self) -> list[str]:
        return list(self.rows[0]) if self.rows else []

    def append(self, row: dict) -> None:
        self.rows.append(dict(row))

    def where(self, **equal) -> NiahTable:
        """Rows whose columns equal the given values, e.g. ``table.where(haystack="passkey",
        rope="none")``."""
        for k in equal:
            if self.rows and k not in self.rows[0]:
                raise ValueError(f"no column {k!r}; columns: {self.columns}")
        keep = [r for r in self.rows if all(r.get(k) == v for k, v in equal.items())]
        return NiahTable(keep, self.meta)

    def unique(self, column: str) -> list:
        return sorted({r[column] for r in self.rows})

    def pivot(self, value: str = "correct", index: str = "length", columns: str = "depth"):
        """``(index_values, column_values, grid)``: the mean of ``value`` per cell, NaN where no trial ran.

        ``grid`` is a float ``[len(index_values), len(column_values)]`` array (booleans average to a rate)."""
        if not self.rows:
            raise ValueError("the table is empty")
        for c in (value, index, columns):
            if c not in self.rows[0]:
                raise ValueError(f"no column {c!r}; columns: {self.columns}")
        rows_v, cols_v = self.unique(index), self.unique(columns)
        sums = np.zeros((len(rows_v), len(cols_v)))
        counts = np.zeros_like(sums)
        for r in self.rows:
            i, j = rows_v.index(r[index]), cols_v.index(r[columns])
            sums[i, j] += float(r[value])
            counts[i, j] += 1
        with np.errstate(invalid="ignore"):
            return rows_v, cols_v, np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)

    def mean(self, value: str, by: str) -> dict:
        """``{group: mean of value}`` over the rows of each value of column ``by``."""
        keys, _, grid = self.pivot(value, by, by)
        return {k: float(np.nanmean(grid[i])) for i, k in enumerate(keys)}

    def rates(self, *by: str, value: str = "correct") -> dict:
        """``{group: Rate}``: successes, trials and the 95 % Wilson interval of boolean column ``value`` per
        group of the ``by`` columns (a group key is a tuple of their values; none: one group, key ``()``)."""
        from longctx.evals.stats import Rate

        if not self.rows:
            raise ValueError("the table is empty")
        for c in (value, *by):
            if c not in self.rows[0]:
                raise ValueError(f"no column {c!r}; columns: {self.columns}")
        groups: dict = {}
        for r in self.rows:
            groups.setdefault(tuple(r[c] for c in by), []).append(bool(r[value]))
        return {k: Rate.of(v) for k, v in sorted(groups.items())}

    def to_json(self) -> str:
        return json.dumps({"meta": self.meta, "rows": self.rows}, indent=1)

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path) -> NiahTable:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"no NIAH table at {path}") from None
        if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
            raise ValueError(f"{path} is not a NIAH table (expected {{'meta': ..., 'rows': [...]}})")
        return cls(data["rows"], data.get("meta"))
