"""What a failed check says: the whole comparison for a function's result, a coarse one for a value answer.

`reveal_lines` (answer_kind="function") shows the answer, the expected value, their ratio and offset: a
test calls the learner's function on inputs of its own, and hidden tests use other inputs, so the
expected result on the visible inputs gives nothing away.

`value_lines` (answer_kind="value") is for a name that is itself the answer. It shows the answer, the
unit, the direction, a coarse factor ("about 2x too large", "roughly 1000x too small") and the hint of a
classic slip, and it checks itself: the same lines must also be what an expected value farther than
2.5 tolerance widths away would produce. When they are not (a narrow band, a small integer), it says
less, down to the direction alone. So no arithmetic on a value message narrows the expected value to
within the tolerance: the answers it is consistent with always span more than the tolerance.
"""

from longctx.grading._plain import FLOAT, INT, close, tolerance_width

# (factor, what a ratio of about that factor usually means), checked in this order.
SLIPS = [
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
# coarse factors of a value answer: (upper bound of the ratio, words); beyond 7x, the nearest power of 10
_BANDS = [(1.1, "{w}, by less than 10 %"), (1.5, "{w}, by 10 % to 50 %"), (2.5, "about 2x {w}"),
          (4.0, "about 3x {w}"), (7.0, "about 5x {w}")]
_ROUNDING = "check the rounding (floor or ceiling) and whether the count includes both ends"


def fmt(x, unit=""):
    s = f"{x:.6g}"
    return f"{s} {unit}".rstrip()


def _magnitude(x):
    return x if x >= 0.0 else -x


def slip_hint(got, expected, min_band=0.0):
    """The hint for a ratio within max(native band, min_band) of a classic slip's factor, or ''."""
    if expected == 0.0 or got == 0.0:
        return ""
    ratio = got / expected
    if ratio < 0.0:
        return "Hint: the sign is flipped." if close(-ratio, 1.0, min_band if min_band > 1e-2 else 1e-2, 0.0) else ""
    for factor, text in SLIPS:
        band = 0.02 if factor >= 1.5 else 0.003
        band = band if band > min_band else min_band
        for r, direction in ((ratio, "too large"), (1.0 / ratio, "too small")):
            if close(r, factor, band, 0.0):
                return f"Hint: your answer is {direction} by {text}"
    return ""


def reveal_lines(got, expected, unit, tol_text):
    """Everything about the comparison: for a function's result on inputs the test chose."""
    lines = [f"got {fmt(got, unit)}, expected {fmt(expected, unit)} (tolerance {tol_text})."]
    if expected != 0.0:
        ratio = got / expected
        lines.append(f"Your answer is {ratio:.4g}x the expected value ({(ratio - 1.0) * 100:+.3g}%).")
    else:
        lines.append(f"Your answer is {fmt(got, unit)} away from zero.")
    hint = slip_hint(got, expected)
    return lines + ([hint] if hint else [])


def reveal_integer_lines(got, expected):
    lines = [f"got {got:,}, expected {expected:,} (off by {got - expected:+,})."]
    if expected != 0 and got != 0:
        if got - expected in (1, -1):
            lines.append(f"Hint: off by one: {_ROUNDING}.")
        else:
            hint = slip_hint(INT.__float__(got), INT.__float__(expected))
            if hint:
                lines.append(hint)
    return lines


def _coarse(got, expected, integer):
    """Direction and coarse factor of `got` against `expected`, in words."""
    if expected == 0.0:
        return "too large" if got > expected else "too small"
    ratio = got / expected
    if got == 0.0:
        return f"{'too small' if expected > 0.0 else 'too large'}: it should not be zero"
    if integer and _magnitude(got - expected) <= 3.0:
        return f"{'too large' if got > expected else 'too small'}, by 1 to 3: {_ROUNDING}"
    if ratio < 0.0:
        size = -ratio
        if size < 1.1 and 1.0 / size < 1.1:
            return "of the wrong sign (its size is within 10 % of the right one)"
        return f"of the wrong sign, and {_band(size, 'too large' if size > 1.0 else 'too small')} in size"
    words = ("too large" if ratio > 1.0 else "too small") + (" in magnitude" if expected < 0.0 else "")
    return _band(ratio, words)


def _band(ratio, words):
    m = ratio if ratio >= 1.0 else 1.0 / ratio
    for upper, text in _BANDS:
        if m < upper:
            return text.format(w=words)
    power, k = 10.0, 1
    while m >= power * 3.1622776601683795:  # sqrt(10): round log10(m) to the nearest integer
        power, k = power * 10.0, k + 1
    return f"roughly {power:.0f}x {words}" if k <= 3 else f"roughly 10^{k}x {words}"


def _value_text(got, expected, unit, width, level, integer):
    shown = f"{got:,}" if integer else fmt(got, unit)
    if level == 0:
        lines = [f"got {shown}: {'too large' if got > expected else 'too small'}."]
    else:
        lines = [f"got {shown}: {_coarse(FLOAT(got), FLOAT(expected), integer)}."]
    if level == 2 and not (integer and _magnitude(got - expected) <= 3):
        mag = _magnitude(expected)
        hint = slip_hint(FLOAT(got), FLOAT(expected), 4.0 * width / mag if mag > 0.0 else 0.0)
        if hint:
            lines.append(hint)
    return lines


def _alternatives(expected, width, integer):
    """Expected values more than 2.5 tolerance widths (for integers: 1) away from `expected`."""
    out = []
    for sign in (1.0, -1.0):
        if integer:
            for k in (1, 2, 3, 4, 6, 10):
                out.append(expected + INT(sign) * k)
            for f in (0.03, 0.1, 0.2, 0.35):
                out.append(INT(FLOAT(expected) * (1.0 + sign * f)))
        else:
            for k in (2.6, 3.5, 6.0, 12.0, 30.0, 100.0):
                out.append(expected + sign * k * width)
            for f in (0.03, 0.1, 0.2, 0.35):
                if f * _magnitude(expected) > 2.5 * width:
                    out.append(expected * (1.0 + sign * f))
    return [e for e in out if e != expected]


def value_lines(got, expected, unit, rel_tol, abs_tol, integer=False):
    """What a failed value answer is told: the most that does not pin `expected` (see the module doc)."""
    width = 0.0 if integer else tolerance_width(expected, rel_tol, abs_tol)
    if not integer and width == 0.0:
        width = 1e-12 * _magnitude(expected) if expected != 0.0 else 1e-300
    for level in (2, 1):
        lines = _value_text(got, expected, unit, width, level, integer)
        same = 0
        for other in _alternatives(expected, width, integer):
            passes = got == other if integer else close(got, other, rel_tol, abs_tol)
            if not passes and _value_text(got, other, unit, width, level, integer) == lines:
                same += 1
        if same >= (2 if integer else 1):
            return lines
    return _value_text(got, expected, unit, width, 0, integer)


def tolerance_text(rel_tol, abs_tol, unit):
    text = f"{rel_tol * 100:g}%" if rel_tol > 0 else ""
    if abs_tol > 0:
        text = (text + " or " if text else "") + f"±{fmt(abs_tol, unit)}"
    return text or "exact"
