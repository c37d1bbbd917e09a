"""The plain-data codec spoken between a student's kernel and the grader's checker processes.

Only plain data crosses the boundary (see autograder/README.md): None, bool, int, float, str, lists,
tuples and dicts of them, numpy arrays and scalars of bool/int/uint/float dtypes (one-element torch
tensors and arrays are sent as numpy arrays). Anything else is refused with `NotPlainData`, naming the
place and the type ("answer[2] is a matplotlib.axes.Axes, not plain data").

Wire format: JSON text (no NaN literals) of a tagged tree. JSON scalars stand for themselves
(null, true/false, integers, finite floats, strings); everything else is an object with a "$" tag:
    {"$": "f", "v": "nan" | "inf" | "-inf"}        non-finite float
    {"$": "l", "v": [...]}   list        {"$": "t", "v": [...]}   tuple
    {"$": "d", "v": [[key, value], ...]}                        dict (keys: scalars or tuples)
    {"$": "nd", "dtype": "float64", "shape": [2, 3], "v": [...flat...]}   numpy array
    {"$": "ns", "dtype": "int64", "v": 5}                       numpy scalar
`decode` is strict: any other shape of JSON is an error, sizes and depths are bounded.

This file is self-contained (standard library only; numpy imported when an array is met) because the
grader also sends its source into the student's kernel, followed by plainserve.py's (the kernel's side):
both then run as one module there.
"""

import json
import math

MIME = "application/x-longctx-reply"
MAX_DEPTH = 40
MAX_ITEMS = 2_000_000
MAX_STR_CHARS = 2_000_000
MAX_TEXT_BYTES = 8 * 2**20   # one request or answer (grader_link.MAX_REPLY_BYTES)
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")


class NotPlainData(ValueError):
    """A value that cannot cross between the student's kernel and the checker."""


def type_name(value):
    t = type(value)
    module = getattr(t, "__module__", "?")
    return t.__qualname__ if module == "builtins" else f"{module}.{t.__qualname__}"


class _Budget:
    def __init__(self):
        self.items = 0

    def take(self, n, where):
        self.items += n
        if self.items > MAX_ITEMS:
            raise NotPlainData(f"{where}: more than {MAX_ITEMS:,} values in total")


def _encode_float(x):
    if x != x:
        return {"$": "f", "v": "nan"}
    if x in (float("inf"), float("-inf")):
        return {"$": "f", "v": "inf" if x > 0 else "-inf"}
    return x


def _array_like(value):
    """(numpy module, ndarray) for an exact numpy array or an exact torch.Tensor, else (None, None)."""
    t = type(value)
    module = getattr(t, "__module__", "")
    if module == "numpy" and t.__name__ == "ndarray":
        import numpy
        if t is numpy.ndarray:
            return numpy, value
    if module == "torch" and t.__name__ == "Tensor":
        import numpy
        import torch
        if t is torch.Tensor:
            return numpy, value.detach().cpu().numpy()
    return None, None


_INT_LIMIT = 2**4096


def _flat_scalars(items):
    """True when every item is an int (not bool) of sane size, a finite float, or a string of sane length."""
    if not items:
        return True
    kinds = set(map(type, items))
    if not kinds <= {int, float, str}:
        return False
    if kinds == {int}:
        return -_INT_LIMIT < min(items) and max(items) < _INT_LIMIT
    if kinds == {float}:
        return all(map(math.isfinite, items))
    if kinds == {str}:
        return max(map(len, items)) <= MAX_STR_CHARS
    return False  # a mix: checked item by item


def _encode(value, where, depth, budget):
    if depth > MAX_DEPTH:
        raise NotPlainData(f"{where} is nested more than {MAX_DEPTH} levels deep")
    t = type(value)
    if value is None or t is bool:
        return value
    if t is int:
        if value.bit_length() > 4096:
            raise NotPlainData(f"{where} is an integer too large to send ({value.bit_length()} bits)")
        return value
    if t is float:
        return _encode_float(value)
    if t is str:
        if len(value) > MAX_STR_CHARS:
            raise NotPlainData(f"{where} is a string of more than {MAX_STR_CHARS:,} characters")
        return value.encode("utf-8", "replace").decode("utf-8")
    if t is list or t is tuple:
        budget.take(len(value), where)
        if _flat_scalars(value):  # fast path: a list of plain numbers or short strings stands for itself
            return {"$": "l" if t is list else "t", "v": list(value)}
        items = [_encode(v, f"{where}[{i}]", depth + 1, budget) for i, v in enumerate(value)]
        return {"$": "l" if t is list else "t", "v": items}
    if t is dict:
        budget.take(len(value), where)
        pairs = []
        for k, v in value.items():
            if not (k is None or type(k) in (bool, int, float, str, tuple)):
                raise NotPlainData(f"{where} has a key of type {type_name(k)} (keys must be numbers, "
                                   "strings or tuples)")
            pairs.append([_encode(k, f"{where} key", depth + 1, budget),
                          _encode(v, f"{where}[{k!r}]", depth + 1, budget)])
        return {"$": "d", "v": pairs}
    numpy, array = _array_like(value)
    if array is not None:
        dtype = str(array.dtype)
        if dtype not in DTYPES:
            raise NotPlainData(f"{where} is an array of dtype {dtype} (allowed: {', '.join(DTYPES)})")
        budget.take(int(array.size), where)
        flat = array.ravel().tolist()
        if array.dtype.kind == "f":
            flat = [_encode_float(x) for x in flat]
        return {"$": "nd", "dtype": dtype, "shape": list(array.shape), "v": flat}
    if getattr(t, "__module__", "") == "numpy":
        import numpy
        if isinstance(value, numpy.generic):
            dtype = str(value.dtype)
            if dtype not in DTYPES:
                raise NotPlainData(f"{where} is a numpy {dtype} (allowed: {', '.join(DTYPES)})")
            item = value.item()
            return {"$": "ns", "dtype": dtype, "v": _encode_float(item) if type(item) is float else item}
    raise NotPlainData(f"{where} is a {type_name(value)}, not plain data")


def encode(value, where="value"):
    """JSON-able tagged tree for `value`; raises NotPlainData naming the first offending part."""
    return _encode(value, where, 0, _Budget())


def dumps(obj):
    """Compact JSON text (no NaN literals), at most MAX_TEXT_BYTES."""
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    if len(text) > MAX_TEXT_BYTES:
        raise NotPlainData(f"the data is larger than {MAX_TEXT_BYTES // 2**20} MiB")
    return text


def _bad_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def loads(text):
    """Parse JSON text strictly (size-bounded, no NaN/Infinity literals)."""
    if len(text) > MAX_TEXT_BYTES:
        raise ValueError(f"message larger than {MAX_TEXT_BYTES // 2**20} MiB")
    return json.loads(text, parse_constant=_bad_constant)


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _decode(obj, depth, budget):
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    t = type(obj)
    if obj is None or t in (bool, int, float):
        return obj
    if t is str:
        if len(obj) > MAX_STR_CHARS:
            raise ValueError("string too long")
        return obj
    if t is not dict or type(obj.get("$")) is not str:
        raise ValueError(f"unexpected {t.__name__} in the data")
    tag = obj["$"]
    if tag == "f" and obj.get("v") in _FLOATS and len(obj) == 2:
        return _FLOATS[obj["v"]]
    if tag in ("l", "t") and type(obj.get("v")) is list and len(obj) == 2:
        budget.take(len(obj["v"]), "list")
        if _flat_scalars(obj["v"]):
            items = obj["v"]
        else:
            items = [_decode(v, depth + 1, budget) for v in obj["v"]]
        return items if tag == "l" else tuple(items)
    if tag == "d" and type(obj.get("v")) is list and len(obj) == 2:
        budget.take(len(obj["v"]), "dict")
        out = {}
        for pair in obj["v"]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict entry")
            key = _decode(pair[0], depth + 1, budget)
            if not (key is None or type(key) in (bool, int, float, str, tuple)):
                raise ValueError("unhashable dict key")
            out[key] = _decode(pair[1], depth + 1, budget)
        return out
    if tag == "nd" and obj.get("dtype") in DTYPES and type(obj.get("shape")) is list and \
            type(obj.get("v")) is list and len(obj) == 4:
        import numpy
        shape = obj["shape"]
        if not all(type(n) is int and n >= 0 for n in shape) or len(shape) > 32:
            raise ValueError("malformed array shape")
        budget.take(len(obj["v"]), "array")
        flat = [_decode_scalar(v) for v in obj["v"]]
        size = 1
        for n in shape:
            size *= n
        if size != len(flat):
            raise ValueError("array shape does not match its data")
        return numpy.array(flat, dtype=obj["dtype"]).reshape(shape)
    if tag == "ns" and obj.get("dtype") in DTYPES and len(obj) == 3:
        import numpy
        return numpy.dtype(obj["dtype"]).type(_decode_scalar(obj.get("v")))
    raise ValueError(f"unknown tag {tag!r} in the data")


def _decode_scalar(v):
    if v is None or type(v) in (bool, int, float):
        if v is None:
            raise ValueError("None inside an array")
        return v
    if type(v) is dict and v.get("$") == "f" and v.get("v") in _FLOATS and len(v) == 2:
        return _FLOATS[v["v"]]
    raise ValueError("non-number inside an array")


def decode(obj):
    """The Python value of a tagged tree (strict; raises ValueError on anything unexpected)."""
    return _decode(obj, 0, _Budget())
