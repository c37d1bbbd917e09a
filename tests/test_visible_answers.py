"""Issue 43: a lesson's *visible* test source holds no expected value of a quantity that is itself the answer.

A learner reads the test cell before running it, so a literal answer there undoes the care of the failure
messages. The scan reads every solution notebook's test cells with ``ast``, splits each at
``### BEGIN HIDDEN TESTS`` and, in the visible part, finds every *expected value*: the third argument of
``check_number`` / ``check_integer`` / ``check_array``, and the constant side of an ``==`` / ``is`` comparison
inside ``check_true``. Constants include formulas of literals (``8_192 * 1e5 ** (-62 / 64)``, ``math.log(4)``)
and names bound to literals in the notebook. It fails when a visible expected value

(a) checks a value answer (a name the notebook binds inside ``### BEGIN SOLUTION``, or an item of it) against
    a constant, or against an expression that needs neither the learner's answers nor their functions (the
    learner could print it): visible checks of a value are of its form, range, units or consistency;
(b) equals, within 1 %, a number that the hidden part of the same cell checks as an expected value;
(c) checks a notebook function on the very arguments the lesson itself calls it with (its own case, whose
    value the lesson asks for or prints) against a constant: visible function checks use other inputs.

A check whose tolerance is at least half its expected value is a range check and is allowed. The last tests
plant each kind of leak in a small notebook and show that the scan catches it, and that toy checks pass.
"""

from __future__ import annotations

import ast
import math
import os
import re

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = sorted(d for d in os.listdir(os.path.join(ROOT, "solutions")) if re.match(r"\d\d_", d))
VALUE_CHECKS = {"check_number", "check_integer", "check_array"}
HIDDEN = "### BEGIN HIDDEN TESTS"
SOLUTION = re.compile(r"^### BEGIN SOLUTION\n(.*?)^### END SOLUTION", re.S | re.M)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b, ast.FloorDiv: lambda a, b: a // b,
        ast.Mod: lambda a, b: a % b}
_MATH = {"pi": math.pi, "e": math.e, "log": math.log, "log2": math.log2, "sqrt": math.sqrt, "exp": math.exp}
NOT_CONSTANT = object()
ANY = object()  # a loop variable of the lesson's own calls: matches any argument


def _parse(source: str) -> ast.Module:
    return ast.parse("\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()))


def constant(node, env=None):
    """The value of an expression of literals, arithmetic, ``math``/``np`` constants and functions and names
    bound to such values in ``env``; ``NOT_CONSTANT`` otherwise."""
    env = env or {}
    try:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id, NOT_CONSTANT)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("math", "np"):
            return _MATH.get(node.attr, NOT_CONSTANT)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = constant(node.operand, env)
            return v if v is NOT_CONSTANT else (-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = constant(node.left, env), constant(node.right, env)
            return NOT_CONSTANT if NOT_CONSTANT in (a, b) else _OPS[type(node.op)](a, b)
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [constant(e, env) for e in node.elts]
            return NOT_CONSTANT if NOT_CONSTANT in items else tuple(items)
        if isinstance(node, ast.Dict) and None not in node.keys:
            items = [(constant(k, env), constant(v, env)) for k, v in zip(node.keys, node.values, strict=True)]
            return NOT_CONSTANT if any(NOT_CONSTANT in kv for kv in items) else tuple(sorted(items, key=repr))
        if isinstance(node, ast.Call) and not node.keywords:
            f = constant(node.func, env)
            args = [constant(a, env) for a in node.args]
            return NOT_CONSTANT if f is NOT_CONSTANT or NOT_CONSTANT in args or not callable(f) else f(*args)
    except (ArithmeticError, TypeError, ValueError):
        pass
    return NOT_CONSTANT


def _numbers(value):
    if isinstance(value, bool) or value is NOT_CONSTANT:
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, tuple):
        return [x for v in value for x in _numbers(v)]
    return []


def _literal_env(trees) -> dict:
    env = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = constant(node.value, env)
                if value is not NOT_CONSTANT:
                    env[node.targets[0].id] = value
    return env


def _is_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _call_key(call: ast.Call, env: dict):
    args = [constant(a, env) for a in call.args] + [(k.arg, constant(k.value, env)) for k in call.keywords]
    return None if any(a is NOT_CONSTANT or (isinstance(a, tuple) and NOT_CONSTANT in a) for a in args) else args


def _same_case(key, lesson_key) -> bool:
    return len(key) == len(lesson_key) and all(b is ANY or a == b for a, b in zip(key, lesson_key, strict=True))


class Lesson:
    """What the scan needs of one notebook: its functions, value answers, literal names and its own calls."""

    def __init__(self, nb):
        others = [_parse(c.source) for c in nb.cells if c.cell_type == "code" and not _is_test(c)]
        self.functions = {n.name for t in others for n in ast.walk(t) if isinstance(n, ast.FunctionDef)}
        self.answers = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                for region in SOLUTION.findall(cell.source):
                    try:
                        tree = ast.parse(region)
                    except SyntaxError:  # an indented region: a function's body
                        continue
                    self.answers |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                                     and isinstance(n.ctx, ast.Store)}
        self.env = _literal_env(others)
        self.calls = []  # (function, argument key): the lesson's own cases
        for tree in others:
            loops = {n.target.id for n in ast.walk(tree) if isinstance(n, (ast.For, ast.comprehension))
                     and isinstance(n.target, ast.Name)}
            env = {**self.env, **{name: ANY for name in loops}}
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
                    key = _call_key(node, env)
                    if key is not None:
                        self.calls.append((node.func.id, key))

    def _uses(self, node, names) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))

    def is_answer(self, node) -> bool:
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args:
            node = node.args[0]
        return isinstance(node, ast.Name) and node.id in self.answers

    def own_case(self, node, env, names=frozenset()) -> bool:
        """``node`` (or an item of it) is a notebook function called on the lesson's own arguments, or a name
        in ``names`` that a test cell bound from such a call."""
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Name):
            return node.id in names
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions):
            return False
        key = _call_key(node, env)
        return key is not None and any(f == node.func.id and _same_case(key, k) for f, k in self.calls)

    def computable(self, node) -> bool:
        """An expected value the learner could print without their answers or functions."""
        return not self._uses(node, self.answers | self.functions)


def _expectations(tree):
    """(call, checked expression, expected expression, tolerances) of every check in ``tree``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        if node.func.id in VALUE_CHECKS and len(node.args) >= 3:
            yield node, node.args[1], node.args[2], kw
        elif node.func.id == "check_true" and len(node.args) >= 2:
            either = _either_bool(node.args[1])
            for cmp in ast.walk(node.args[1]):
                if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], (ast.Eq, ast.Is)) \
                        and ast.unparse(cmp.left) not in either:
                    yield node, cmp.left, cmp.comparators[0], {}
                    yield node, cmp.comparators[0], cmp.left, {}


def _either_bool(condition) -> set[str]:
    """Expressions that ``condition`` compares with both True and False (``x is True or x is False``: a form
    check, not an answer)."""
    seen = {}
    for cmp in ast.walk(condition):
        if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.comparators[0], ast.Constant) \
                and isinstance(cmp.comparators[0].value, bool):
            seen.setdefault(ast.unparse(cmp.left), set()).add(cmp.comparators[0].value)
    return {expr for expr, values in seen.items() if values == {True, False}}


def _range_check(expected: float, kw, env) -> bool:
    rel, abs_ = constant(kw.get("rel_tol", ast.Constant(0.0)), env), constant(kw.get("abs_tol", ast.Constant(0.0)), env)
    if NOT_CONSTANT in (rel, abs_) or not isinstance(expected, (int, float)):
        return False
    return max(rel * abs(expected), abs_) >= 0.5 * abs(expected) > 0


def leaks(nb) -> list[str]:
    """Every visible expected value of a test cell that gives an answer away, as 'cell N line L: why'."""
    lesson, problems = Lesson(nb), []
    for index, cell in enumerate(nb.cells):
        if not _is_test(cell):
            continue
        visible, _, hidden = cell.source.partition(HIDDEN)
        vtree = _parse(visible)
        env = {**lesson.env, **_literal_env([vtree])}
        bound = {t.id for n in ast.walk(vtree) if isinstance(n, ast.Assign) and lesson.own_case(n.value, env)
                 for target in n.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
        checked_here = {ast.unparse(c) for _, c, _, _ in _expectations(vtree)}
        hidden_numbers = []  # what the hidden part checks of an answer, or of a quantity the visible part checks too
        if hidden:
            htree = _parse(hidden.replace("### END HIDDEN TESTS", ""))
            henv = {**env, **_literal_env([htree])}
            hidden_numbers = [x for _, c, e, _ in _expectations(htree)
                              if lesson.is_answer(c) or lesson.own_case(c, henv) or ast.unparse(c) in checked_here
                              for x in _numbers(constant(e, henv))]
        for call, checked, expected, kw in _expectations(vtree):
            value = constant(expected, env)
            where = f"cell {index} line {call.lineno}: {ast.unparse(checked)[:60]} vs {ast.unparse(expected)[:40]}"
            if value is not NOT_CONSTANT and _range_check(value, kw, env):
                continue
            if lesson.is_answer(checked) and (value is not NOT_CONSTANT or lesson.computable(expected)):
                problems.append(f"{where}: a value answer checked against its expected value")
            elif value is not NOT_CONSTANT and lesson.own_case(checked, env, bound):
                problems.append(f"{where}: the lesson's own case of a function, with its value")
            elif any(abs(x - h) <= 0.01 * max(abs(x), abs(h)) for x in _numbers(value) for h in hidden_numbers):
                problems.append(f"{where}: a value the hidden tests check")
    return problems


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_answer_in_a_visible_test_source(lesson):
    nb = nbformat.read(os.path.join(ROOT, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)
    problems = leaks(nb)
    assert not problems, f"{lesson}: visible test sources give answers away:\n" + "\n".join(problems)


# ---------------------------------------------------------------- the scan, seen to catch planted leaks
def _notebook(solution: str, test: str):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import math\n\ndef f(x, y=1):\n    return x * y\n\nprint(f(64, 3))"),
                nbformat.v4.new_code_cell(solution, metadata={"nbgrader": {"solution": True, "grade": False}}),
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
                                + "\ncheck_number('f(2, 5)', f(2, 5), 10, answer_kind='function')\n### END HIDDEN TESTS",
}  # fmt: skip
CLEAN = {
    "toy input": "check_number('f(2, 3)', f(2, 3), 6, answer_kind='function', hint='2 x 3')",
    "form of a value": "check_true('answer is a float', isinstance(answer, float) and 0 < answer < 1, 'a ratio')",
    "a bool, either": "check_true('choice is a bool', choice is True or choice is False, 'True or False')",
    "round toy values": "check_number('f(2, 5)', f(2, 5), 10, answer_kind='function')\n" + HIDDEN
                        + "\ncheck_number('f(5, 2.001)', f(5, 2.001), 10.005, answer_kind='function')\n### END HIDDEN TESTS",
    "range check": "check_number('answer', answer, 0.5, answer_kind='value', rel_tol=1.0)",
    "self-consistency": "check_number('answer / f(answer)', answer / f(answer), 1.0, answer_kind='function')",
    "hidden value stays hidden": "check_true('choice is a str', isinstance(choice, str), 'a name')\n" + HIDDEN
                                 + "\ncheck_number('answer', answer, 0.1174, answer_kind='value')\n### END HIDDEN TESTS",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scan_catches_a_planted_answer(name):
    assert len(leaks(_notebook(ANSWER, PLANTED[name]))) == 1, name


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_the_scan_passes_checks_that_give_nothing_away(name):
    assert leaks(_notebook(ANSWER, CLEAN[name])) == [], name


def test_constants_fold_formulas_and_names():
    env = {"L": 8_192}
    assert constant(ast.parse("L * 1e5 ** (-62 / 64)", mode="eval").body, env) == pytest.approx(0.11739, rel=1e-4)
    assert constant(ast.parse("math.log(4)", mode="eval").body) == pytest.approx(math.log(4))
    assert constant(ast.parse("len(x)", mode="eval").body) is NOT_CONSTANT
