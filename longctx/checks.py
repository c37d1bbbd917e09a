"""Argument checks shared across the package: what counts as an integer, and the positive-integer check.

No dependencies (no numpy, no torch), so every module may import it.
"""

from __future__ import annotations

import math
import numbers


def as_integer(value: object, *, floats: bool = False) -> int | None:
    """``value`` as an int when it is an integer: a Python or numpy integer (anything with ``__index__``)
    but not a bool, and with ``floats`` also an integral real such as ``4.0`` (a JSON or CLI value).
    None when it is not one."""
    if isinstance(value, bool):
        return None
    if hasattr(value, "__index__"):
        return int(value)
    if floats and isinstance(value, numbers.Real) and math.isfinite(value) and int(value) == value:
        return int(value)
    return None


def positive_int(name: str, value: object, *, allow_none: bool = False, floats: bool = True,
                 what: str | None = None) -> int | None:
    """``value`` as an int >= 1 (see ``as_integer``; ``floats=False`` refuses ``4.0``); None stays None
    with ``allow_none``. Otherwise ``ValueError("<name> must be <what>, got <value!r>")``, ``what`` being
    "a positive integer" (+ " or None"). ``name`` carries the caller's wording ("ModelSpec x: num_layers")."""
    if value is None and allow_none:
        return None
    n = as_integer(value, floats=floats)
    if n is None or n < 1:
        what = what or ("a positive integer or None" if allow_none else "a positive integer")
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return n
