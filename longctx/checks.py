"""Argument checks shared across the package, the one place they are written: what counts as an integer,
positive integers, token counts (``memory`` re-exports ``check_token_count``), non-negative and positive
numbers, fractions in (0, 1] and eviction fractions in [0, 1).

Each raises ``ValueError`` saying what is wrong and what is allowed. (Request bodies of the server are
checked by its pydantic models instead, ``longctx.serve.protocol``.) No dependencies (no numpy, no torch),
so every module may import it.
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


def check_token_count(name: str, value: object, *, allow_zero: bool = True) -> int:
    """Validate a token count (an integer >= 0, or >= 1 without allow_zero) and return it as int."""
    count = as_integer(value)  # numpy integers too
    if count is None:
        raise ValueError(f"{name} must be an integer number of tokens, got {value!r}")
    if count < 0 or (count == 0 and not allow_zero):
        allowed = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"{name} must be {allowed} tokens, got {count}")
    return count


def _real(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real)


def nonnegative_number(name: str, value: object) -> float:
    """``value`` as a float when it is a finite real number >= 0."""
    if not _real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def positive_number(name: str, value: object, *, what: str = "a finite number > 0") -> float:
    """``value`` as a float when it is a finite real number > 0; else ``ValueError("<name> must be <what>,
    got <value!r>")``."""
    if not _real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def unit_fraction(name: str, value: object, meaning: str) -> float:
    """``value`` as a float when it is a real number in (0, 1]; ``meaning`` says what it is a fraction of."""
    if not _real(value) or not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1] ({meaning}), got {value!r}")
    return float(value)


EVICTED = "the fraction of prompt tokens evicted"


def eviction_fraction(name: str, value: object, meaning: str = EVICTED) -> float:
    """``value`` as a float when it is a real number in [0, 1): a KV press's compression ratio (all evicted
    would leave nothing to attend to)."""
    if not _real(value) or not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1) ({meaning}), got {value!r}")
    return float(value)
