"""The checks a test cell calls. Each returns None when the answer passes and raises AssertionError with a
message that teaches when it does not; see the package docstring for the policy on what a message shows."""

from longctx.grading import _messages as msg
from longctx.grading._plain import (
    LIST,
    Reject,
    close,
    describe,
    plain_float,
    plain_integer,
    plain_nested,
    plain_scalar,
    static_type_from,
)

ANSWER_KINDS = ("value", "function")
_KIND_HELP = ("answer_kind='value' (the checked name is itself the answer: a failure never reveals the "
              "expected value) or answer_kind='function' (the result of the learner's function on inputs the "
              "test chose: the expected result on those inputs may be shown)")


def _kind(check, answer_kind):
    if answer_kind is None:
        raise TypeError(f"{check}() needs {_KIND_HELP}")
    if answer_kind not in ANSWER_KINDS:
        raise ValueError(f"{check}(): answer_kind={answer_kind!r} is not allowed; use {_KIND_HELP}")
    return answer_kind == "value"


def _fail(name, lines, hint=""):
    """Raise the message: what was compared, then the exercise's own hint, then a generic slip's hint.

    A test's `hint` knows its exercise; the generic hints (a factor of 2, of 1000, of 3 ...) only match a
    ratio and are often about something else, so when both are there the test's comes first and the generic
    one is offered as a second guess."""
    generic = [line for line in lines if line.startswith("Hint: ")]
    text = f"{name}: " + "\n  ".join(line for line in lines if not line.startswith("Hint: "))
    if hint:
        text += f"\n  Hint: {hint}"
        for line in generic:
            text += "\n  If that is not it, a common slip of this size: " + line[len("Hint: "):]
    else:
        for line in generic:
            text += "\n  " + line
    raise AssertionError(text)


def check_number(name, answer, expected, *, answer_kind=None, rel_tol=1e-2, abs_tol=0.0, unit="", hint=""):
    """Pass when `answer` is a real number within rel_tol (relative) or abs_tol (absolute) of `expected`."""
    value = _kind("check_number", answer_kind)
    exp, rel, abs_ = plain_float(expected), plain_float(rel_tol), plain_float(abs_tol)
    try:
        got = plain_float(answer)
    except Reject as exc:
        _fail(name, [exc.args[0] if value else f"{exc.args[0]} (expected about {msg.fmt(exp, unit)})."], hint)
    if close(got, exp, rel, abs_):
        return None
    tol_text = msg.tolerance_text(rel, abs_, unit)
    if value:
        lines = msg.value_lines(got, exp, unit, rel, abs_)
        lines[0] = lines[0][:-1] + f" (tolerance {tol_text})."
    else:
        lines = msg.reveal_lines(got, exp, unit, tol_text)
    _fail(name, lines, hint)


def check_integer(name, answer, expected, *, answer_kind=None, hint=""):
    """Pass when `answer` is exactly the integer `expected` (an integral float such as 4096.0 is fine)."""
    value = _kind("check_integer", answer_kind)
    exp = plain_scalar(expected)
    try:
        got = plain_integer(answer)
    except Reject as exc:
        _fail(name, [f"{exc.args[0]}; a whole number is expected." if value
                     else f"{exc.args[0]} (expected the integer {exp})."], hint)
    if got == exp:
        return None
    _fail(name, msg.value_lines(got, exp, "", 0.0, 0.0, integer=True) if value
          else msg.reveal_integer_lines(got, exp), hint)


def check_array(name, answer, expected, *, answer_kind=None, rel_tol=1e-2, abs_tol=0.0, unit="", hint=""):
    """Pass when `answer` has the shape of `expected` and every element is within tolerance."""
    value = _kind("check_array", answer_kind)
    exp, exp_shape = plain_nested(expected)
    rel, abs_ = plain_float(rel_tol), plain_float(abs_tol)
    try:
        got, got_shape = plain_nested(answer)
    except Reject as exc:
        _fail(name, [f"{exc.args[0]}; expected an array of shape {exp_shape}."], hint)
    if got_shape != exp_shape:
        _fail(name, [f"got shape {got_shape}, expected shape {exp_shape}."], hint)
    bad, i, n = [], 0, LIST.__len__(exp)
    while i < n:  # no range(): builtins can be monkey-patched
        if not close(got[i], exp[i], rel, abs_):
            LIST.append(bad, i)
        i += 1
    if LIST.__len__(bad) == 0:
        return None
    first = bad[0]
    head = (f"{LIST.__len__(bad)} of {n} elements are outside the tolerance "
            f"({msg.tolerance_text(rel, abs_, unit)}).")
    if value:
        lines = msg.value_lines(got[first], exp[first], unit, rel, abs_)
        lines[0] = f"the first, at flat index {first}: " + lines[0]
    else:
        lines = [f"First mismatch at flat index {first}: got {msg.fmt(got[first], unit)}, "
                 f"expected {msg.fmt(exp[first], unit)}."]
        hint_line = msg.slip_hint(got[first], exp[first])
        lines += [hint_line] if hint_line else []
    _fail(name, [head] + lines, hint)


def check_true(name, condition, message):
    """Pass when `condition` is the bool True (or a numpy bool that is True); otherwise say `message`.

    There is no expected value to hide here: `message` is the test's own words, and must not quote the
    expected value of a value answer. (A visible test of a bool value answer checks only that it is a bool:
    whether True or False is right is the answer.)"""
    result = condition
    np_t = static_type_from(condition, ("numpy",))
    if np_t is not None and np_t.__name__ in ("bool", "bool_"):
        result = np_t.item(condition)
    if result is True:
        return None
    if result is False:
        _fail(name, [message])
    _fail(name, [f"{message} (the check expected True or False, got {describe(condition)})"])
