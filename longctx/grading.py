"""Checks used by the notebooks' test cells, with messages that teach.

Every check converts the learner's answer to plain Python numbers *itself* and compares those, so an
object that overrides ``__eq__``, ``__float__`` or ``__abs__`` earns nothing. It never calls a helper a
notebook could monkey-patch (``numpy.isclose``, ``math.isclose``, ``torch.allclose``, builtins such as
``abs`` or ``float``): the pass/fail decision uses only methods of the built-in ``int`` and ``float`` types,
which Python does not let anyone change.

Accepted answers: ``int``, ``float`` (and their subclasses, read through the built-in type so a lying
subclass is read at its real value), numpy scalars and 0-d / one-element arrays, one-element torch
tensors. Rejected with a clear message: ``bool``, ``None``, strings, NaN / infinity, any other object.

The module imports neither numpy nor torch: it recognises their types by being C-level (static) types
defined in the ``numpy`` / ``torch._C`` modules, which user code cannot subclass into liars without the
subclass becoming a Python (heap) type.

    check_number(name, answer, expected, *, rel_tol=1e-2, abs_tol=0.0, unit="", hint="")
    check_integer(name, answer, expected, hint="")
    check_array(name, answer, expected, *, rel_tol=1e-2, abs_tol=0.0, unit="", hint="")
    check_true(name, condition, message)

In `make lab` these checks run in the learner's own kernel and teach. In `make grade` a test cell never
runs in the student's kernel: it runs in a separate, pristine checker process that has this module from
the instructor's library and receives only plain data from the notebook (values, results of calling the
student's functions); see autograder/README.md. The defensive conversions above still matter there:
numpy scalars and arrays arrive as numpy values and must be read exactly.
"""

# References taken from literals, not from (patchable) builtins.
_FLOAT = (0.0).__class__
_INT = (0).__class__
_BOOL = (True).__class__
_TYPE = _INT.__class__
_LIST = [].__class__
_TUPLE = ().__class__
_STR = "".__class__
_FLAGS = _TYPE.__dict__["__flags__"]
_MODULE = _TYPE.__dict__["__module__"]
_MRO = _TYPE.__dict__["__mro__"]
_HEAPTYPE = 1 << 9
_INF = _FLOAT("inf")

__all__ = ["check_number", "check_integer", "check_array", "check_true"]


class _Reject(Exception):
    """The answer is not a number we can read safely; the message says why."""


def _static_type_from(obj, modules):
    """Return type(obj) if it is a C-level type defined in one of `modules`, else None."""
    t = _TYPE(obj)
    if _FLAGS.__get__(t) & _HEAPTYPE:
        return None
    if _MODULE.__get__(t) in modules:
        return t
    return None


def _torch_base(obj):
    """The C-level TensorBase type if `obj` is exactly a torch.Tensor (not a subclass), else None."""
    t = _TYPE(obj)
    if _MODULE.__get__(t) != "torch" or t.__name__ != "Tensor":
        return None
    mro = _MRO.__get__(t)
    if len(mro) != 3:
        return None
    base = mro[1]
    if _FLAGS.__get__(base) & _HEAPTYPE or _MODULE.__get__(base) != "torch._C":
        return None
    return base


def _describe(obj):
    t = _TYPE(obj)
    return f"{_MODULE.__get__(t)}.{t.__qualname__}" if _MODULE.__get__(t) != "builtins" else t.__name__


def _plain_scalar(obj):
    """Convert `obj` to an exact int or float, never calling a method `obj` could override."""
    t = _TYPE(obj)
    if t is _BOOL:
        raise _Reject("got a bool (True/False); a number is expected here")
    if t is _INT or t is _FLOAT:
        return obj
    np_t = _static_type_from(obj, ("numpy",))
    if np_t is not None and np_t.__name__ not in ("str_", "bytes_", "void", "object_", "datetime64", "timedelta64"):
        if np_t.__name__ == "ndarray" and np_t.size.__get__(obj) != 1:
            raise _Reject(f"got an array of shape {np_t.shape.__get__(obj)}; a single number is expected here")
        value = np_t.item(obj)
        if _TYPE(value) is _BOOL:
            raise _Reject("got a numpy bool; a number is expected here")
        if _TYPE(value) is _INT or _TYPE(value) is _FLOAT:
            return value
        raise _Reject(f"got a numpy value of type {_describe(value)}; a real number is expected")
    base = _torch_base(obj)
    if base is not None:
        n = base.numel(obj)
        if n != 1:
            raise _Reject(f"got a tensor with {n} elements; a single number is expected here")
        value = base.item(obj)
        if _TYPE(value) is _INT or _TYPE(value) is _FLOAT:
            return value
        raise _Reject(f"got a tensor holding {_describe(value)}; a real number is expected")
    # Subclasses of int / float: read the value the built-in type stores, ignore any overrides.
    for klass in _MRO.__get__(t):
        if klass is _FLOAT:
            return _FLOAT.__float__(obj)
        if klass is _INT:
            return _INT.__int__(obj)
    if obj is None:
        raise _Reject("got None; did the function forget a `return`?")
    raise _Reject(f"got an object of type {_describe(obj)}; expected a number "
                  "(int, float, numpy scalar or one-element tensor)")


def _plain_float(obj):
    value = _plain_scalar(obj)
    if _TYPE(value) is _INT:
        try:
            value = _INT.__float__(value)
        except OverflowError:
            raise _Reject("got an integer too large to represent as a float") from None
    if value != value:
        raise _Reject("got NaN (not a number)")
    if value == _INF or value == -_INF:
        raise _Reject("got infinity")
    return value


def _close(got, expected, rel_tol, abs_tol):
    """|got - expected| <= max(rel_tol * |expected|, abs_tol), with float methods only."""
    diff = got - expected
    if diff < 0.0:
        diff = -diff
    mag = expected if expected >= 0.0 else -expected
    tol = rel_tol * mag
    if abs_tol > tol:
        tol = abs_tol
    return diff <= tol


def _fmt(x, unit=""):
    s = f"{x:.6g}"
    return f"{s} {unit}".rstrip()


_FACTORS = [
    (1e9, "a factor of 10^9: a unit slip (e.g. FLOPs vs GFLOPs, bytes vs GB, ns vs s)?"),
    (1e6, "a factor of 10^6: a unit slip (e.g. bytes vs MB, us vs s)?"),
    (1e3, "a factor of 1000: a unit slip (e.g. ms vs s, bytes vs KB, GB vs TB)?"),
    (2.0 ** 30, "a factor of 2^30: bytes vs GiB?"),
    (2.0 ** 20, "a factor of 2^20: bytes vs MiB?"),
    (1024.0, "a factor of 1024: KiB vs bytes, or MiB vs KiB?"),
    (1.073741824, "a factor of 1.074 = 2^30/10^9: GiB and GB mixed up?"),
    (1.048576, "a factor of 1.049 = 2^20/10^6: MiB and MB mixed up?"),
    (2.0, "a factor of 2: the causal-mask halving of attention FLOPs, K and V counted once instead of "
          "twice, 2 bytes per fp16 value, or 2 FLOPs per multiply-add?"),
    (4.0, "a factor of 4: fp32 (4 bytes) vs 1 byte, or two factors of 2 at once?"),
    (8.0, "a factor of 8: bits vs bytes?"),
    (3.0, "a factor of 3: query heads vs KV heads (grouped-query attention)?"),
]


def _ratio_hint(got, expected):
    if expected == 0.0 or got == 0.0:
        return ""
    ratio = got / expected
    if ratio < 0.0:
        if _close(-ratio, 1.0, 1e-2, 0.0):
            return "Hint: the sign is flipped."
        return ""
    for factor, text in _FACTORS:
        for r, direction in ((ratio, "too large"), (1.0 / ratio, "too small")):
            if _close(r, factor, 0.02 if factor >= 1.5 else 0.003, 0.0):
                return f"Hint: your answer is {direction} by {text}"
    return ""


def _fail(name, lines, hint=""):
    text = f"{name}: " + "\n  ".join(lines)
    if hint:
        text += f"\n  Hint: {hint}"
    raise AssertionError(text)


def check_number(name, answer, expected, *, rel_tol=1e-2, abs_tol=0.0, unit="", hint=""):
    """Pass when `answer` is a real number within rel_tol (relative) or abs_tol (absolute) of expected."""
    exp = _plain_float(expected)
    rel = _plain_float(rel_tol)
    abs_ = _plain_float(abs_tol)
    try:
        got = _plain_float(answer)
    except _Reject as exc:
        _fail(name, [f"{exc.args[0]} (expected about {_fmt(exp, unit)})."], hint)
    if _close(got, exp, rel, abs_):
        return True
    tol_text = f"{rel * 100:g}%" if rel > 0 else ""
    if abs_ > 0:
        tol_text = (tol_text + " or " if tol_text else "") + f"±{_fmt(abs_, unit)}"
    lines = [f"got {_fmt(got, unit)}, expected {_fmt(exp, unit)} (tolerance {tol_text or 'exact'})."]
    if exp != 0.0:
        ratio = got / exp
        lines.append(f"Your answer is {ratio:.4g}x the expected value ({(ratio - 1.0) * 100:+.3g}%).")
    else:
        lines.append(f"Your answer is {_fmt(got, unit)} away from zero.")
    ratio_hint = _ratio_hint(got, exp)
    if ratio_hint:
        lines.append(ratio_hint)
    _fail(name, lines, hint)


def check_integer(name, answer, expected, hint=""):
    """Pass when `answer` is exactly the integer `expected` (an integral float such as 4096.0 is fine)."""
    exp = _plain_scalar(expected)
    try:
        got = _plain_scalar(answer)
        if _TYPE(got) is _FLOAT:
            if got != got or got == _INF or got == -_INF or got != _FLOAT.__floor__(got):
                raise _Reject(f"got {got!r}, which is not a whole number")
            got = _FLOAT.__int__(got)
    except _Reject as exc:
        _fail(name, [f"{exc.args[0]} (expected the integer {exp})."], hint)
    if got == exp:
        return True
    lines = [f"got {got:,}, expected {exp:,} (off by {got - exp:+,})."]
    if exp != 0 and got != 0:
        ratio_hint = _ratio_hint(_INT.__float__(got), _INT.__float__(exp))
        if got - exp in (1, -1):
            lines.append("Hint: off by one: check whether the count includes both ends, or rounds up.")
        elif ratio_hint:
            lines.append(ratio_hint)
    _fail(name, lines, hint)


def _plain_nested(obj, where):
    """Convert lists / tuples / numpy arrays / tensors to (flat list of floats, shape tuple)."""
    t = _TYPE(obj)
    np_t = _static_type_from(obj, ("numpy",))
    if np_t is not None and np_t.__name__ == "ndarray":
        return _plain_nested(np_t.tolist(obj), where)
    base = _torch_base(obj)
    if base is not None:
        return _plain_nested(base.tolist(obj), where)
    if t is _LIST or t is _TUPLE:
        flat, shape = [], None
        n = _LIST.__len__(obj) if t is _LIST else _TUPLE.__len__(obj)
        i = 0
        while i < n:  # no range(): builtins can be monkey-patched
            sub_flat, sub_shape = _plain_nested(obj[i], f"{where}[{i}]")
            if shape is None:
                shape = sub_shape
            elif shape != sub_shape:
                raise _Reject(f"ragged nesting at {where}[{i}]: shape {sub_shape} vs {shape}")
            _LIST.extend(flat, sub_flat)
            i += 1
        return flat, (n,) + (shape if shape is not None else ())
    try:
        return [_plain_float(obj)], ()
    except _Reject as exc:
        raise _Reject(f"element {where or 'answer'}: {exc.args[0]}") from None


def check_array(name, answer, expected, *, rel_tol=1e-2, abs_tol=0.0, unit="", hint=""):
    """Pass when `answer` has the shape of `expected` and every element is within tolerance."""
    exp, exp_shape = _plain_nested(expected, "")
    rel = _plain_float(rel_tol)
    abs_ = _plain_float(abs_tol)
    try:
        got, got_shape = _plain_nested(answer, "")
    except _Reject as exc:
        _fail(name, [f"{exc.args[0]}; expected an array of shape {exp_shape}."], hint)
    if got_shape != exp_shape:
        _fail(name, [f"got shape {got_shape}, expected shape {exp_shape}."], hint)
    bad, i, n = [], 0, _LIST.__len__(exp)
    while i < n:  # no range(): builtins can be monkey-patched
        if not _close(got[i], exp[i], rel, abs_):
            _LIST.append(bad, i)
        i += 1
    if _LIST.__len__(bad) == 0:
        return True
    first = bad[0]
    lines = [f"{len(bad)} of {len(exp)} elements are outside the tolerance "
             f"({rel * 100:g}%{f' or ±{_fmt(abs_, unit)}' if abs_ > 0 else ''}).",
             f"First mismatch at flat index {first}: got {_fmt(got[first], unit)}, "
             f"expected {_fmt(exp[first], unit)}."]
    ratio_hint = _ratio_hint(got[first], exp[first])
    if ratio_hint:
        lines.append(ratio_hint)
    _fail(name, lines, hint)


def check_true(name, condition, message):
    """Pass when `condition` is the bool True (or a numpy bool that is True); otherwise say `message`."""
    value = condition
    np_t = _static_type_from(condition, ("numpy",))
    if np_t is not None and np_t.__name__ in ("bool", "bool_"):
        value = np_t.item(condition)
    if value is True:
        return True
    if value is False:
        _fail(name, [message])
    _fail(name, [f"{message} (the check expected True or False, got {_describe(condition)})"])
