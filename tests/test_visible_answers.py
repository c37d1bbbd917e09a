"""Issue 43: a lesson's *visible* test source holds no expected value of a quantity that is itself the answer.

A learner reads the test cell before running it, so a literal answer there undoes the care of the failure
messages. tests/visible_scan.py finds, in the visible part of every solution notebook's test cells, each
expected value (a check's argument, an equality, a one-value membership, ``abs(x - c) < t``, ``isclose``, a
tight range, a bound written as a formula) and every number written in a string; its docstring gives the
rules. The last tests plant each kind of leak in a small notebook and show that the scan catches it, and that
form, range and consistency checks pass.
"""

from __future__ import annotations

import ast
import math
import os
import re

import nbformat
import pytest
from visible_scan import (
    HIDDEN,
    NOT_CONSTANT,
    Lesson,
    constant,
    expectations,
    is_test,
    literal_env,
    numbers,
    parse,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(d for d in os.listdir(os.path.join(ROOT, "solutions")) if re.match(r"\d\d_", d))
# Findings known and being fixed elsewhere: (lesson, "cell N (grade_id) line L"), as the scan prints them.
KNOWN: set[tuple[str, str]] = set()
_NUMBER = re.compile(r"(?<![\w.])\d{1,3}(?:[,_]\d{3})+(?:\.\d+)?|(?<![\w.])\d+(?:\.\d+)?(?:e[+-]?\d+)?", re.I)


def string_numbers(tree) -> list[tuple[int, str, float]]:
    """(line, text, value) of every number written in a string constant of ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for m in _NUMBER.finditer(node.value):
                found.append((node.lineno, m.group(0), float(m.group(0).replace(",", "").replace("_", ""))))
    return found


def near(x: float, hidden: list[float]) -> bool:
    return x != 0 and any(abs(x - h) <= 0.01 * max(abs(x), abs(h)) for h in hidden)


def _invert(expr, value, env):
    """Undo the arithmetic on ``expr`` with constants: (the expression inside, the bound on it)."""
    while isinstance(expr, ast.BinOp) and isinstance(value, (int, float)):
        k_left, k_right = constant(expr.left, env), constant(expr.right, env)
        if (k_right is not NOT_CONSTANT and isinstance(expr.op, (ast.Mult, ast.Add, ast.Sub, ast.Div))
                and k_right):
            value = {ast.Mult: value / k_right, ast.Add: value - k_right, ast.Sub: value + k_right,
                     ast.Div: value * k_right}[type(expr.op)]
            expr = expr.left
        elif k_left is not NOT_CONSTANT and isinstance(expr.op, (ast.Mult, ast.Add)) and k_left:
            value = value / k_left if isinstance(expr.op, ast.Mult) else value - k_left
            expr = expr.right
        else:
            break
    return expr, value


def _formula(node) -> bool:
    """A constant written as arithmetic beyond a lone power (``2**30``) or sign: it computes a quantity."""
    return any(isinstance(n, ast.BinOp) and not isinstance(n.op, ast.Pow) for n in ast.walk(node))




def _hidden_numbers(lesson, hidden, env, checked_here):
    """What the hidden part checks of an answer, of the lesson's own case, or of an expression the visible
    part checks too."""
    if not hidden:
        return []
    htree = parse(hidden.replace("### END HIDDEN TESTS", ""))
    henv = {**env, **literal_env([htree])}
    found, _ = expectations(htree, henv)
    return [x for e in found if lesson.is_answer(e.checked) or lesson.own_case(e.checked, henv)
            or ast.unparse(e.checked) in checked_here for x in numbers(e.value)]


def _cell_leaks(lesson, index, cell):
    visible, _, hidden = cell.source.partition(HIDDEN)
    vtree = parse(visible)
    env = {**lesson.env, **literal_env([vtree])}
    bound = {t.id for n in ast.walk(vtree) if isinstance(n, ast.Assign) and lesson.own_case(n.value, env)
             for target in n.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
    found, bounds = expectations(vtree, env)
    derived = lesson.derived(vtree)
    hidden_numbers = _hidden_numbers(lesson, hidden, env, {ast.unparse(e.checked) for e in found})
    problems, tag = [], f"cell {index} ({cell.metadata['nbgrader'].get('grade_id')})"
    for e in found:
        where = f"{tag} line {e.line}: {ast.unparse(e.checked)[:60]} ({e.kind})"
        if e.value is not NOT_CONSTANT and e.range_check():
            continue
        if lesson.is_answer(e.checked) and (e.value is not NOT_CONSTANT
                                            or (e.node is not None and lesson.computable(e.node))):
            problems.append(f"{where}: a value answer checked against its expected value")
        elif e.value is not NOT_CONSTANT and lesson.own_case(e.checked, env, bound):
            problems.append(f"{where}: the lesson's own case of a function, with its value")
        elif any(near(x, hidden_numbers) for x in numbers(e.value)):
            problems.append(f"{where}: a value the hidden tests check")
    sides = {}
    for _, expr, _, side in bounds:
        sides.setdefault(ast.unparse(expr), set()).add(side)
    for line, expr, node, _side in bounds:
        core, value = _invert(expr, constant(node, env), env)
        answer_like = lesson.learner_made(core, derived)
        one_sided = len(sides[ast.unparse(expr)]) == 1  # a formula bound inside a range is a form check
        if answer_like and ((_formula(node) and one_sided)
                            or (isinstance(value, (int, float)) and near(value, hidden_numbers))):
            problems.append(f"{tag} line {line}: {ast.unparse(expr)[:60]} (bound): "
                            f"a bound that computes the answer ({ast.unparse(node)[:40]})")
    for line, text, value in string_numbers(vtree):
        if near(value, hidden_numbers):
            problems.append(f"{tag} line {line}: {text!r} (string): a number the hidden tests check")
    lines = {}
    for problem in problems:  # one finding per line: the first reason
        lines.setdefault(problem.split(":")[0], problem)
    return list(lines.values())


def leaks(nb) -> list[str]:
    """Every visible expectation of a test cell that gives an answer away, as 'cell N line L: why'."""
    lesson = Lesson(nb)
    return [p for i, cell in enumerate(nb.cells) if is_test(cell) for p in _cell_leaks(lesson, i, cell)]


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_answer_in_a_visible_test_source(lesson):
    nb = nbformat.read(os.path.join(ROOT, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)
    known = {k[1] for k in KNOWN if k[0] == lesson}
    found = leaks(nb)
    problems = [p for p in found if p.split(":")[0] not in known]
    stale = known - {p.split(":")[0] for p in found}
    assert not stale, (f"{lesson}: KNOWN lists findings the scan no longer makes (delete them): "
                       f"{sorted(stale)}")
    assert not problems, f"{lesson}: visible test sources give answers away:\n" + "\n".join(problems)


# ---------------------------------------------------------------- the scan, seen to catch planted leaks
def _notebook(solution: str, test: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import math\n\ndef f(x, y=1):\n    return x * y\n\n"
                                          "print(f(64, 3))\n\n"
                                          "def g(s, kind, n):\n    return {'n': n}\n\n"
                                          "print(g(shape(m), 'fp8', 64))"),
                nbformat.v4.new_code_cell(solution,
                                          metadata={"nbgrader": {"solution": True, "grade": False}}),
                nbformat.v4.new_code_cell(test, metadata={"nbgrader": {"solution": False, "grade": True}})]
    return nb


ANSWER = "### BEGIN SOLUTION\nanswer = 8_192 * 100_000.0 ** (-62 / 64)\nchoice = 'fp8'\n### END SOLUTION\n"
PLANTED = {
    "value literal": "check_number('answer', answer, 0.1174, answer_kind='value', rel_tol=1e-3)",
    "value formula": "check_number('answer', answer, 8_192 * 1e5 ** (-62 / 64), answer_kind='value')",
    "value from the library": "check_number('answer', answer, rope.span(64, 1e5), answer_kind='value')",
    "value in check_true": "check_true('choice', choice == 'fp8', 'think')",
    "item of a value": "check_true('answer', answer[0] == 3, 'think')",
    "own case": "check_number('f(64, 3)', f(64, 3), 192, answer_kind='function')",
    "own case, formula": "check_number('f(64, 3)', f(64, 3), 64 * 3, answer_kind='function')",
    "own case, through a name": "got = f(64, 3)\ncheck_number('f(64, 3)', got, 192, answer_kind='function')",
    "hidden value": "check_number('f(0.1175, 1)', f(0.1175, 1), 0.1175, answer_kind='function')\n" + HIDDEN
                    + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n### END HIDDEN TESTS",
    "hidden value, same check": "check_number('f(2, 5)', f(2, 5), 10, answer_kind='function')\n" + HIDDEN
                                + "\ncheck_number('f(2, 5)', f(2, 5), 10, answer_kind='function')\n"
                                "### END HIDDEN TESTS",
    "abs difference": "check_true('answer', abs(answer - 0.1174) < 1e-3, 'think')",
    "math.isclose": "check_true('answer', math.isclose(answer, 0.1174, rel_tol=1e-2), 'think')",
    "np.isclose": "check_true('answer', bool(np.isclose(answer, 0.1174)), 'think')",
    "pytest.approx": "assert answer == pytest.approx(0.1174, rel=1e-2)",
    "tight range": "check_true('answer', 0.117 < answer < 0.118, 'think')",
    "tight range, two compares": "check_true('answer', answer > 0.117 and answer <= 0.118, 'think')",
    "plain assert": "assert choice == 'fp8', 'think'",
    "one-value membership": "check_true('choice', choice in ('fp8',), 'think')",
    "expected keyword": "check_number('answer', answer, expected=0.1174, answer_kind='value')",
    "number in a hint": "check_true('answer is a float', isinstance(answer, float), 'near 0.117')\n" + HIDDEN
                        + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n"
                        "### END HIDDEN TESTS",
    "number in a check's name": "check_true('answer (0.1174) is a float', isinstance(answer, float), "
                                "'a ratio')\n"
                                + HIDDEN + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n"
                                "### END HIDDEN TESTS",
    "bound that computes the answer": "mine = g({'a': 1}, 'fp8', 64)\n"
                                      "check_true('slots', mine['n'] * 16 >= 2_048 + 64 * 6_144, "
                                      "'every token a slot')",
    "bound at the hidden value": "check_true('answer', 4 * answer >= 4 * 0.1174, 'x')\n" + HIDDEN
                                 + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n"
                                 "### END HIDDEN TESTS",
}  # fmt: skip
CLEAN = {
    "toy input": "check_number('f(2, 3)', f(2, 3), 6, answer_kind='function', hint='2 x 3')",
    "form of a value": "check_true('answer is a float', isinstance(answer, float) and 0 < answer < 1, "
                       "'a ratio')",
    "a bool, either": "check_true('choice is a bool', choice is True or choice is False, 'True or False')",
    "round toy values": "check_number('f(2, 5)', f(2, 5), 10, answer_kind='function')\n" + HIDDEN
                        + "\ncheck_number('f(5, 2.001)', f(5, 2.001), 10.005, answer_kind='function')\n"
                        "### END HIDDEN TESTS",
    "range check": "check_number('answer', answer, 0.5, answer_kind='value', rel_tol=1.0)",
    "self-consistency": "check_number('answer / f(answer)', answer / f(answer), 1.0, answer_kind='function')",
    "hidden value stays hidden": "check_true('choice is a str', isinstance(choice, str), 'a name')\n" + HIDDEN
                                 + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n"
                                 "### END HIDDEN TESTS",
    "a wide range": "check_true('answer', 0.01 < answer < 1.0, 'a ratio')",
    "a loose bound": "check_true('answer', answer * 16 >= 1, 'at least')",
    "membership among the options": "check_true('choice', choice in ('fp8', 'int4', 'bf16'), "
                                    "'one of the three')",
    "consistency, abs": "check_true('answer', abs(answer - f(answer, 1)) < 1e-9, 'the same number')",
    "consistency, bound": "mine = g({'a': 1}, 'fp8', 64)\n"
                          "check_true('n', mine['n'] <= f(answer, 1000), 'at most')",
    "bounds of an implication": "check_true('a', answer > 0, 'p')\n"
                                "check_true('b', (answer > 1) is (f(2) > 1), 'q')\n"
                                "check_true('c', choice != 'x' or answer <= 1, 'r')",
    "a hint without the hidden number": "check_true('answer', isinstance(answer, float), "
                                        "'between 0.01 and 1')\n"
                                        + HIDDEN
                                        + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n"
                                        "### END HIDDEN TESTS",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scan_catches_a_planted_answer(name):
    assert len(leaks(_notebook(ANSWER, PLANTED[name]))) == 1, name


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_the_scan_passes_checks_that_give_nothing_away(name):
    assert leaks(_notebook(ANSWER, CLEAN[name])) == [], name


def test_constants_fold_formulas_and_names():
    env = {"L": 8_192}
    assert constant(ast.parse("L * 1e5 ** (-62 / 64)", mode="eval").body, env) == pytest.approx(0.11739,
                                                                                             rel=1e-4)
    assert constant(ast.parse("math.log(4)", mode="eval").body) == pytest.approx(math.log(4))
    assert constant(ast.parse("len(x)", mode="eval").body) is NOT_CONSTANT
