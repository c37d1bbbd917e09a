"""Reading a learner's answer as plain Python numbers, without trusting the answer's own methods.

Every function here converts with methods of the built-in ``int`` and ``float`` types only (taken from
literals, not from patchable builtins), and recognises numpy and torch values by their C-level (static)
types, which user code cannot subclass into liars without the subclass becoming a Python (heap) type.
Neither numpy nor torch is imported.
"""

# References taken from literals, not from (patchable) builtins.
FLOAT = (0.0).__class__
INT = (0).__class__
_BOOL = (True).__class__
TYPE = INT.__class__
LIST = [].__class__
_TUPLE = ().__class__
_FLAGS = TYPE.__dict__["__flags__"]
_MODULE = TYPE.__dict__["__module__"]
_MRO = TYPE.__dict__["__mro__"]
_HEAPTYPE = 1 << 9
INF = FLOAT("inf")


class Reject(Exception):
    """The answer is not a number we can read safely; the message says why."""


def static_type_from(obj, modules):
    """Return type(obj) if it is a C-level type defined in one of `modules`, else None."""
    t = TYPE(obj)
    if _FLAGS.__get__(t) & _HEAPTYPE:
        return None
    if _MODULE.__get__(t) in modules:
        return t
    return None


def _torch_base(obj):
    """The C-level TensorBase type if `obj` is exactly a torch.Tensor (not a subclass), else None."""
    t = TYPE(obj)
    if _MODULE.__get__(t) != "torch" or t.__name__ != "Tensor":
        return None
    mro = _MRO.__get__(t)
    if len(mro) != 3:
        return None
    base = mro[1]
    if _FLAGS.__get__(base) & _HEAPTYPE or _MODULE.__get__(base) != "torch._C":
        return None
    return base


def describe(obj):
    """The type of `obj` as a reader knows it: `float`, `numpy.ndarray`, ..."""
    t = TYPE(obj)
    return f"{_MODULE.__get__(t)}.{t.__qualname__}" if _MODULE.__get__(t) != "builtins" else t.__name__


def plain_scalar(obj):
    """Convert `obj` to an exact int or float, never calling a method `obj` could override."""
    t = TYPE(obj)
    if t is _BOOL:
        raise Reject("got a bool (True/False); a number is expected here")
    if t is INT or t is FLOAT:
        return obj
    np_t = static_type_from(obj, ("numpy",))
    if np_t is not None and np_t.__name__ not in ("str_", "bytes_", "void", "object_", "datetime64",
                                                  "timedelta64"):
        if np_t.__name__ == "ndarray" and np_t.size.__get__(obj) != 1:
            raise Reject(f"got an array of shape {np_t.shape.__get__(obj)}; a single number is expected here")
        value = np_t.item(obj)
        if TYPE(value) is _BOOL:
            raise Reject("got a numpy bool; a number is expected here")
        if TYPE(value) is INT or TYPE(value) is FLOAT:
            return value
        raise Reject(f"got a numpy value of type {describe(value)}; a real number is expected")
    base = _torch_base(obj)
    if base is not None:
        n = base.numel(obj)
        if n != 1:
            raise Reject(f"got a tensor with {n} elements; a single number is expected here")
        value = base.item(obj)
        if TYPE(value) is INT or TYPE(value) is FLOAT:
            return value
        raise Reject(f"got a tensor holding {describe(value)}; a real number is expected")
    # Subclasses of int / float: read the value the built-in type stores, ignore any overrides.
    for klass in _MRO.__get__(t):
        if klass is FLOAT:
            return FLOAT.__float__(obj)
        if klass is INT:
            return INT.__int__(obj)
    if obj is None:
        raise Reject("got None; did the function forget a `return`?")
    raise Reject(f"got an object of type {describe(obj)}; expected a number "
                 "(int, float, numpy scalar or one-element tensor)")


def plain_float(obj):
    """`obj` as a finite float (see plain_scalar); NaN and infinities are rejected."""
    value = plain_scalar(obj)
    if TYPE(value) is INT:
        try:
            value = INT.__float__(value)
        except OverflowError:
            raise Reject("got an integer too large to represent as a float") from None
    if value != value:
        raise Reject("got NaN (not a number)")
    if value == INF or value == -INF:
        raise Reject("got infinity")
    return value


def plain_integer(obj):
    """`obj` as an exact int; an integral float such as 4096.0 is accepted."""
    got = plain_scalar(obj)
    if TYPE(got) is FLOAT:
        if got != got or got == INF or got == -INF or got != FLOAT.__floor__(got):
            raise Reject(f"got {got!r}, which is not a whole number")
        got = FLOAT.__int__(got)
    return got


def plain_nested(obj, where=""):
    """Convert lists / tuples / numpy arrays / tensors to (flat list of floats, shape tuple)."""
    t = TYPE(obj)
    np_t = static_type_from(obj, ("numpy",))
    if np_t is not None and np_t.__name__ == "ndarray":
        return plain_nested(np_t.tolist(obj), where)
    base = _torch_base(obj)
    if base is not None:
        return plain_nested(base.tolist(obj), where)
    if t is LIST or t is _TUPLE:
        flat, shape = [], None
        n = LIST.__len__(obj) if t is LIST else _TUPLE.__len__(obj)
        i = 0
        while i < n:  # no range(): builtins can be monkey-patched
            sub_flat, sub_shape = plain_nested(obj[i], f"{where}[{i}]")
            if shape is None:
                shape = sub_shape
            elif shape != sub_shape:
                raise Reject(f"ragged nesting at {where}[{i}]: shape {sub_shape} vs {shape}")
            LIST.extend(flat, sub_flat)
            i += 1
        return flat, (n,) + (shape if shape is not None else ())
    try:
        return [plain_float(obj)], ()
    except Reject as exc:
        raise Reject(f"element {where or 'answer'}: {exc.args[0]}") from None


def close(got, expected, rel_tol, abs_tol):
    """|got - expected| <= max(rel_tol * |expected|, abs_tol), with float methods only."""
    diff = got - expected
    if diff < 0.0:
        diff = -diff
    return diff <= tolerance_width(expected, rel_tol, abs_tol)


def tolerance_width(expected, rel_tol, abs_tol):
    """max(rel_tol * |expected|, abs_tol): how far an answer may be from `expected` and still pass."""
    mag = expected if expected >= 0.0 else -expected
    tol = rel_tol * mag
    return abs_tol if abs_tol > tol else tol
