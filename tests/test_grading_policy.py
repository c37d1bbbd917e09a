"""The message policy of longctx.grading, attacked, and the lessons' test cells held to it.

- A value answer's failure message cannot be turned back into the expected value. The attack parses every
  number in the message (answers, factors, percentages, 2^20, 1,024), combines each with the learner's own
  answer (x, /, +, -, as a percentage, alone, negated, rounded for integers; pairs of numbers too) and
  tries every result against the expected value. It *recovers* the value when one result is within the
  tolerance of the expected value AND of every other expected value that produces the very same message
  (found by probing a dense grid of expected values around it): only then did the message, rather than
  luck, carry the answer. (An answer exactly a coarse factor off is recovered by luck: it is the slip.)
  For check_number, check_integer and check_array, over seeded random and edge cases: nothing recovered.
  The same attack recovers nearly every function-kind message, which shows the expected value by design.
- Every check returns None when it passes, so a passing test cell displays nothing.
- The lessons (solutions/ and the released lessons/): every check_number / check_integer / check_array
  call names its answer_kind, and the right one: "function" exactly when the checked answer comes from
  calling a function the notebook defines; a value check's hint quotes no number (or pair of numbers) that
  lands within the tolerance of its expected value; no test cell prints, and none ends with an expression
  that would display a value.
"""

from __future__ import annotations

import ast
import glob
import math
import os
import random
import re

import nbformat
import pytest

from longctx.grading import ANSWER_KINDS, check_array, check_integer, check_number, check_true

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?(?:\^-?\d+)?")
SLIP_FACTORS = [1e9, 1e6, 1e3, 2.0 ** 30, 2.0 ** 20, 1024.0, 1.073741824, 1.048576, 2.0, 4.0, 8.0, 3.0]


# ---------------------------------------------------------------- the attack
def numbers_in(text: str) -> list[float]:
    out = []
    for token in NUMBER.findall(text):
        base, _, power = token.replace(",", "").partition("^")
        try:
            out.append(float(base) ** float(power) if power else float(base))
        except OverflowError:
            continue
    return out


def candidates(got: float, text: str) -> set[float]:
    """Every value simple arithmetic on the message's numbers and the learner's answer gives."""
    numbers = numbers_in(text)
    pool = (list(numbers) + [a * b for a in numbers for b in numbers]
            + [a / b for a in numbers for b in numbers if b])
    out = set()
    for n in pool:
        out |= {n, -n, got * n, got + n, got - n, got * (1 + n / 100), got * (1 - n / 100)}
        if n:
            out.add(got / n)
        for q in (1 + n / 100, 1 - n / 100):
            if q:
                out.add(got / q)
    return {c for c in out if math.isfinite(c)}


def _message(check, got, expected, **kwargs) -> str | None:
    try:
        check("x", got, expected, **kwargs)
    except AssertionError as exc:
        return str(exc)
    return None


def _within(c, e, rel, abs_, integer):
    if integer:
        return any(r == e for r in (math.floor(c), math.ceil(c), round(c)))
    return abs(c - e) <= max(rel * abs(e), abs_)


def _probes(expected, rel, abs_, integer=False):
    """A dense grid of expected values around `expected` (more than 1.5 tolerance widths away)."""
    if integer:
        out = {expected + k for k in range(-12, 13)}
        out |= {round(expected * (1 + f)) for f in (-0.4, -0.2, -0.1, -0.05, 0.05, 0.1, 0.2, 0.4)}
    else:
        width = max(rel * abs(expected), abs_) or 1e-12 * abs(expected) or 1e-300
        out = {expected + s * k * width for s in (-1, 1) for k in (1.5, 2, 2.6, 3.5, 5, 8, 12, 20, 50, 100)}
        out |= {expected * (1 + s * f) for s in (-1, 1) for f in (0.01, 0.03, 0.1, 0.2, 0.35, 0.6)}
    out.discard(expected)
    return out


def _leak(text, got, expected, rel, abs_, integer, message_for):
    """A value the attack gets from `text` that is within tolerance of `expected` and of every other
    expected value whose message (message_for(e)) is the same text; None when there is none."""
    alternatives = None
    for c in candidates(float(got), text.split(": ", 1)[1]):
        if _within(c, expected, rel, abs_, integer):
            if alternatives is None:
                alternatives = [e for e in _probes(expected, rel, abs_, integer) if message_for(e) == text]
            if all(_within(c, e, rel, abs_, integer) for e in alternatives):
                return c, sorted(alternatives)[:4]
    return None


def recovered(check, got, expected, rel=0.0, abs_=0.0, integer=False, **kwargs) -> str:
    """'' when the message of `got` against `expected` does not give `expected` away, else how it does."""
    text = _message(check, got, expected, **kwargs)
    assert text is not None, f"{got!r} passes against {expected!r}: not a failing case"
    leak = _leak(text, got, expected, rel, abs_, integer, lambda e: _message(check, got, e, **kwargs))
    return f"{leak[0]!r} from {text!r} (the same message only for {leak[1]})" if leak else ""


def _random_ratio(rng: random.Random, tol: float) -> float:
    kind = rng.random()
    if kind < 0.35:
        r = 10 ** rng.uniform(-5, 5)
    elif kind < 0.6:
        r = 1 + rng.choice((-1, 1)) * rng.uniform(1.05 * tol, 0.6)
    elif kind < 0.85:
        factor = rng.choice(SLIP_FACTORS)
        r = ((factor if rng.random() < 0.5 else 1 / factor)
             * (1 + rng.uniform(-0.05, 0.05) * (rng.random() < 0.7)))
    else:
        r = rng.choice((0.0, -1.0, -2.0, -1e3, -(1 + rng.uniform(-0.2, 0.2))))
    return r


def _float_cases(n=600, seed=28):
    rng = random.Random(seed)
    cases = []
    while len(cases) < n:
        rel = rng.choice((1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 5e-2))
        exp = rng.choice((-1, 1, 1, 1, 1)) * 10 ** rng.uniform(-6, 12)
        abs_ = 0.0
        if rng.random() < 0.1:
            exp, rel, abs_ = 0.0, 0.0, 10 ** rng.uniform(-12, -3)
        elif rng.random() < 0.1:
            abs_ = abs(exp) * rng.choice((1e-3, 1e-2, 0.1))
        got = exp * _random_ratio(rng, rel) if exp else rng.choice((-1, 1)) * abs_ * 10 ** rng.uniform(0.1, 6)
        if abs(got - exp) > max(rel * abs(exp), abs_):
            cases.append((got, exp, rel, abs_))
    return cases


def _integer_cases(n=600, seed=28):
    rng = random.Random(seed)
    cases = []
    while len(cases) < n:
        exp = rng.choice((rng.randint(0, 20), rng.randint(21, 10_000), rng.randint(10_001, 10**10)))
        kind = rng.random()
        if kind < 0.35:
            got = exp + rng.choice((-5, -4, -3, -2, -1, 1, 2, 3, 4, 5))
        elif kind < 0.65:
            got = round(exp * rng.choice(SLIP_FACTORS) ** rng.choice((-1, 1))) + rng.choice((0, 0, 1, -1))
        elif kind < 0.9:
            got = round(exp * 10 ** rng.uniform(-3, 3))
        else:
            got = rng.choice((0, -exp, -1, 1))
        if got != exp:
            cases.append((got, exp))
    return cases


def test_value_messages_of_check_number_give_nothing_away():
    leaks = [(got, exp, rel, abs_, why) for got, exp, rel, abs_ in _float_cases()
             if (why := recovered(check_number, got, exp, rel, abs_, rel_tol=rel, abs_tol=abs_,
                                  answer_kind="value", unit="B"))]
    assert not leaks, f"{len(leaks)} value messages give the expected value away, e.g. {leaks[:3]}"


def test_value_messages_of_check_integer_give_nothing_away():
    leaks = [(got, exp, why) for got, exp in _integer_cases()
             if (why := recovered(check_integer, got, exp, integer=True, answer_kind="value"))]
    assert not leaks, f"{len(leaks)} value messages give the expected integer away, e.g. {leaks[:3]}"


def test_value_messages_of_check_array_give_nothing_away():
    rng = random.Random(6)
    leaks = []
    for got, exp, rel, abs_ in _float_cases(300, seed=7):
        right = [rng.uniform(1, 100) for _ in range(rng.randint(0, 3))]
        where = rng.randint(0, len(right))
        answer = right[:where] + [got] + right[where:]

        def message_for(e, answer=answer, right=right, where=where, rel=rel, abs_=abs_):
            return _message(check_array, answer, right[:where] + [e] + right[where:], rel_tol=rel,
                            abs_tol=abs_, answer_kind="value")

        leak = _leak(message_for(exp), got, exp, rel, abs_, False, message_for)
        if leak:
            leaks.append((answer, exp, leak, message_for(exp)))
    assert not leaks, f"{len(leaks)} array messages give an expected element away, e.g. {leaks[:3]}"


def test_the_attack_recovers_function_messages_which_show_the_expected_value():
    """The attack has teeth: a function-kind message (expected value shown by design) is recovered."""
    cases = [case for case in _float_cases(300, seed=3) if case[2] >= 1e-4]  # shown to 6 significant digits
    hits = sum(bool(recovered(check_number, got, exp, rel, abs_, rel_tol=rel, abs_tol=abs_,
                              answer_kind="function"))
               for got, exp, rel, abs_ in cases)
    assert hits >= 0.95 * len(cases), (hits, len(cases))
    ints = _integer_cases(300, seed=3)
    assert sum(bool(recovered(check_integer, got, exp, integer=True, answer_kind="function"))
               for got, exp in ints) >= 0.95 * len(ints)


@pytest.mark.parametrize("got, expected, words", [
    (117.440512, 112.0, ["got 117.441 MiB", "too large, by less than 10 %", "MiB and MB mixed up"]),
    (112e3, 112.0, ["roughly 1000x too large", "unit slip (ms vs s"]),
    (56.0, 112.0, ["about 2x too small", "factor of 2"]),
    (-112.0, 112.0, ["wrong sign", "the sign is flipped"]),
    (0.0, 112.0, ["too small: it should not be zero"]),
])
def test_value_messages_still_teach(got, expected, words):
    text = _message(check_number, got, expected, rel_tol=1e-3, unit="MiB", answer_kind="value")
    for word in words:
        assert word in text, (word, text)
    assert "expected" not in text and "112" not in text.split(" MiB", 1)[1], text


def test_integer_value_message_near_the_answer_names_the_rounding_slip():
    text = _message(check_integer, 858, 857, answer_kind="value")
    assert "too large, by 1 to 3" in text and "floor or ceiling" in text and "857" not in text, text


# ---------------------------------------------------------------- passing checks display nothing
@pytest.mark.parametrize("answer_kind", ANSWER_KINDS)
def test_every_check_returns_none_when_it_passes(answer_kind):
    assert check_number("x", 2.0, 2.0, answer_kind=answer_kind) is None
    assert check_integer("n", 7, 7, answer_kind=answer_kind) is None
    assert check_array("a", [1.0, 2.0], [1.0, 2.0], answer_kind=answer_kind) is None
    assert check_true("t", True, "must hold") is None


@pytest.mark.parametrize("check, args", [(check_number, ("x", 1.0, 1.0)), (check_integer, ("n", 1, 1)),
                                         (check_array, ("a", [1], [1]))])
def test_answer_kind_is_required_and_checked(check, args):
    with pytest.raises(TypeError, match="answer_kind='value'.*answer_kind='function'"):
        check(*args)
    with pytest.raises(ValueError, match="'values' is not allowed"):
        check(*args, answer_kind="values")


# ---------------------------------------------------------------- the lessons' test cells
CHECKS = {"check_number", "check_integer", "check_array"}
SILENT_CALLS = CHECKS | {"check_true"}


def _notebooks(folder):
    return sorted(glob.glob(os.path.join(ROOT, folder, "*", "*.ipynb")))


def _parse(source):
    return ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                               for line in source.splitlines()))


def _is_test(cell):
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and meta.get("grade") and not meta.get("solution")


def _notebook_functions(nb):
    names = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and not _is_test(cell):
            for node in ast.walk(_parse(cell.source)):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
    return names


def _calls_any(node, names):
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
               or isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Load)
               for n in ast.walk(node))


def _from_functions(tree, functions):
    """Names the test cell binds from a call of one of the notebook's functions (to a fixed point)."""
    derived = set()
    while True:
        before = len(derived)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _calls_any(node.value, functions | derived) and \
                    any(isinstance(n, ast.Call) for n in ast.walk(node.value)) or \
                    isinstance(node, ast.Assign) and _calls_any(node.value, derived):
                derived |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.For) and _calls_any(node.iter, functions | derived):
                derived |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        if len(derived) == before:
            return derived


def _lesson_checks():
    for path in _notebooks("solutions"):
        nb = nbformat.read(path, as_version=4)
        functions = _notebook_functions(nb)
        for index, cell in enumerate(nb.cells):
            if not _is_test(cell):
                continue
            tree = _parse(cell.source)
            derived = _from_functions(tree, functions)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CHECKS:
                    where = f"{os.path.basename(path)} cell {index} line {node.lineno}"
                    yield where, node, functions | derived


def test_every_lesson_check_names_the_right_answer_kind():
    problems, counted = [], {"value": 0, "function": 0}
    for where, node, callables in _lesson_checks():
        kinds = [k.value for k in node.keywords if k.arg == "answer_kind"]
        if len(kinds) != 1 or not isinstance(kinds[0], ast.Constant) or kinds[0].value not in ANSWER_KINDS:
            problems.append(f"{where}: {node.func.id} without a literal answer_kind")
            continue
        kind = kinds[0].value
        counted[kind] += 1
        right = "function" if _calls_any(node.args[1], callables) else "value"
        if kind != right:
            problems.append(f"{where}: answer_kind={kind!r} for {ast.unparse(node.args[1])!r} "
                            f"(should be {right!r})")
    assert not problems, "\n".join(problems)
    assert counted["value"] and counted["function"], counted


def _constant(node):
    """The value of an expression made of number literals and arithmetic, else None."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b, ast.FloorDiv: lambda a, b: a // b}
    if (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in ops:
        a, b = _constant(node.left), _constant(node.right)
        return None if a is None or b is None else ops[type(node.op)](a, b)
    return None


def test_value_hints_do_not_quote_the_expected_value():
    problems = []
    for where, node, _ in _lesson_checks():
        keywords = {k.arg: k.value for k in node.keywords}
        kind = keywords.get("answer_kind")
        hint = keywords.get("hint")
        if not (isinstance(kind, ast.Constant) and kind.value == "value" and isinstance(hint, ast.Constant)):
            continue
        expected = _constant(node.args[2])
        if expected is None:
            continue
        rel = (_constant(keywords["rel_tol"]) if "rel_tol" in keywords
               else (0.0 if node.func.id == "check_integer" else 1e-2))
        abs_ = _constant(keywords["abs_tol"]) if "abs_tol" in keywords else 0.0
        # a range check ("is a fraction"), not an answer
        if max(rel * abs(expected), abs_) >= 0.5 * abs(expected) > 0:
            continue
        numbers = numbers_in(hint.value)
        pool = numbers + [a * b for a in numbers for b in numbers] \
            + [a / b for a in numbers for b in numbers if b] \
            + [a + b for a in numbers for b in numbers] + [a - b for a in numbers for b in numbers]
        near = [n for n in pool if abs(n - expected) <= max(rel * abs(expected), abs_, 1e-12 * abs(expected))]
        if near:
            problems.append(f"{where}: the hint {hint.value!r} gives {near[0]!r}, the expected value")
    assert not problems, "\n".join(problems)


def _displays(source):
    """Why running `source` in Jupyter would display something, or ''."""
    tree = _parse(source)
    printing = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id in ("print", "display")]
    if printing:
        return f"calls {printing[0].func.id}() on line {printing[0].lineno}"
    if not tree.body or not isinstance(tree.body[-1], ast.Expr) or source.rstrip().endswith(";"):
        return ""
    value = tree.body[-1].value
    silent = SILENT_CALLS | {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                             and not any(isinstance(r, ast.Return) and r.value is not None
                                         for r in ast.walk(n))}
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in silent:
        return ""
    return f"ends with the expression {ast.unparse(value)[:80]!r}, which Jupyter would display"


@pytest.mark.parametrize("folder", ["solutions", "lessons"])
def test_test_cells_display_nothing_when_they_pass(folder):
    problems, seen = [], 0
    for path in _notebooks(folder):
        nb = nbformat.read(path, as_version=4)
        for index, cell in enumerate(nb.cells):
            if _is_test(cell):
                seen += 1
                why = _displays(cell.source)
                if why:
                    problems.append(f"{os.path.relpath(path, ROOT)} cell {index}: {why}")
    assert seen, f"no test cells found in {folder}/"
    assert not problems, "\n".join(problems)
