"""What a failed check says: the whole comparison for a function's result, a coarse one for a value answer.

`reveal_lines` (answer_kind="function") shows the answer, the expected value, their ratio and offset: a
test calls the learner's function on inputs of its own, and hidden tests use other inputs, so the
expected result on the visible inputs gives nothing away.

`value_lines` (answer_kind="value") is for a name that is itself the answer: it shows the answer, the
unit, the direction, a coarse factor and the hint of a classic slip, from regions of expected values
that are wider than the tolerance (_coarse.py).
"""

from longctx.grading import _coarse
from longctx.grading._plain import INT, close

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


def fmt(x, unit=""):
    s = f"{x:.6g}"
    return f"{s} {unit}".rstrip()


def slip_hint(got, expected):
    """The hint for a ratio close to a classic slip's factor, or ''."""
    if expected == 0.0 or got == 0.0:
        return ""
    ratio = got / expected
    if ratio < 0.0:
        return "Hint: the sign is flipped." if close(-ratio, 1.0, 1e-2, 0.0) else ""
    for factor, text in SLIPS:
        for r, direction in ((ratio, "too large"), (1.0 / ratio, "too small")):
            if close(r, factor, 0.02 if factor >= 1.5 else 0.003, 0.0):
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
            lines.append(f"Hint: off by one: {_coarse.ROUNDING}.")
        else:
            hint = slip_hint(INT.__float__(got), INT.__float__(expected))
            if hint:
                lines.append(hint)
    return lines


def value_lines(got, expected, unit, rel_tol, abs_tol, integer=False):
    """What a failed value answer is told: the coarse region of the expected value (see _coarse.py)."""
    text, slip = _coarse.describe(got, expected, rel_tol, abs_tol, integer)
    lines = [f"got {f'{got:,}' if integer else fmt(got, unit)}: {text}."]
    return lines + ([f"Hint: {slip}"] if slip else [])


def tolerance_text(rel_tol, abs_tol, unit):
    text = f"{rel_tol * 100:g}%" if rel_tol > 0 else ""
    if abs_tol > 0:
        text = (text + " or " if text else "") + f"±{fmt(abs_tol, unit)}"
    return text or "exact"
