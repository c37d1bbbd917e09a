"""Audit of every hidden test of the lessons: expected values never come from names the notebook defines.

A test cell runs in the grader's checker (autograder/README.md), which fetches each name the notebook
defines from the student's kernel: whatever the student's code assigned. A check whose *expected* value
is built from such a name therefore trusts the student (issue 44: lesson 08's exercise 8.5 computed its
expected TTFTs from the notebook's `cold_ttft_s`, `prompt_tokens` and `common_prefix_tokens`, so a
notebook that set them to anything consistent earned the points without measuring anything).

Which is which:
- **hidden tests** (between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS`) are the ones that award
  the points for value answers. Their expected values must come from literals, the library (names the
  lesson binds only by `import`, or imports in the test itself), or a recomputation from inputs the test
  itself sets (`_h = [...]`; `for _args, _want in [...]`). This file fails on any hidden check whose
  expected side reads a name the notebook defines (assigned, def'd or looped over in a cell that is not a
  test cell), directly or through a test variable built from one;
- **visible checks** (the rest of a test cell) are the student's own sanity checks: they may compare two of
  the notebook's values (`0 < on < off`) or read a notebook name on either side, since the student sees
  them and they are not what makes an answer right.

"Expected side": the third argument (or `expected=`) of a `check_*` call; the second argument of
`isclose` / `allclose` / `assert_allclose` / `array_equal`; in a comparison (`==`, `<`, `in`, ...), every
operand after the first (the first is the answer under test), and, where the first is a difference or a
ratio (`abs(answer - expected) < tol`, `answer / expected < 1.01`), its subtracted or dividing side. A
comparison of two of the notebook's own values is thus a finding too: it holds for any consistent set of
made-up numbers.
"""

from __future__ import annotations

import ast
import glob
import os
import sys

import nbformat
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "autograder"))
from checkplan import plan  # noqa: E402  (the grader's own rule for which names come from the kernel)

BEGIN, END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOLUTIONS = sorted(glob.glob(os.path.join(REPO, "solutions", "*", "*.ipynb")))


def _is_test(cell):
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.cell_type == "code" and meta.get("grade", False) and not meta.get("solution", False)


def kernel_names(nb, test_source) -> set[str]:
    """The names a test cell reads that the notebook defines: exactly those the checker fetches from the
    student's kernel (free names of the test bound by the notebook other than by `import`)."""
    sources = [c.source for c in nb.cells if c.cell_type == "code" and not _is_test(c)]
    return set(plan(test_source, sources)["kernel_names"])


def _reads(node) -> set[str]:
    """Names an expression reads from outside itself (comprehension variables and lambda arguments
    excluded)."""
    loaded, bound = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
    return loaded - bound


def _targets(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _positions(iterable, displays):
    """The expressions feeding each position of a tuple loop target, where the iterable shows them:
    `zip(a, b)`, `enumerate(a)`, `d.items()` of a dict display, a list or tuple display of tuples."""
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords:
        if iterable.func.id == "zip":
            return [[arg] for arg in iterable.args]
        if iterable.func.id == "enumerate" and len(iterable.args) == 1:
            return [[], iterable.args]
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Attribute) and \
            iterable.func.attr == "items" and isinstance(iterable.func.value, ast.Name):
        display = displays.get(iterable.func.value.id)
        if isinstance(display, ast.Dict) and None not in display.keys:
            return [display.keys, display.values]
    if isinstance(iterable, (ast.List, ast.Tuple)) and iterable.elts and \
            all(isinstance(e, ast.Tuple) and len(e.elts) == len(iterable.elts[0].elts)
               for e in iterable.elts):
        return [list(col) for col in zip(*(e.elts for e in iterable.elts), strict=True)]
    return None


class _Audit:
    """Walks a test cell's statements in order, tracking which of the test's own names hold values from
    the kernel (a later assignment from clean inputs clears a name), and reports the expected sides that
    read one, in the hidden lines only."""

    def __init__(self, kernel, hidden_lines):
        self.bad, self.hidden, self.displays, self.found = set(kernel), hidden_lines, {}, []

    def bind(self, target, tainted):
        names = _targets(target)
        self.bad = (self.bad | names) if tainted else (self.bad - names)

    def loop(self, node):
        columns = _positions(node.iter, self.displays) if isinstance(node.target, ast.Tuple) else None
        if columns is not None and len(columns) == len(node.target.elts):
            for target, column in zip(node.target.elts, columns, strict=True):
                self.bind(target, any(_reads(e) & self.bad for e in column))
        else:
            self.bind(node.target, bool(_reads(node.iter) & self.bad))

    def statements(self, body):
        for node in body:
            self.statement(node)

    def statement(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            saved, local = self.bad, {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            self.bad = self.bad - local
            self.statements(node.body)
            uses = set().union(*(_reads(n) for n in node.body)) - local
            self.bad = saved | {node.name} if uses & saved else saved - {node.name}
            return
        self.audit(node)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            tainted = bool(_reads(node.value) & self.bad) or \
                (isinstance(node, ast.AugAssign) and bool(_targets(node.target) & self.bad))
            for target in targets:
                self.bind(target, tainted)
                if isinstance(target, ast.Name):
                    self.displays[target.id] = node.value
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self.loop(node)
            self.statements(node.body)
            self.statements(node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, bool(_reads(item.context_expr) & self.bad))
            self.statements(node.body)
        elif isinstance(node, (ast.If, ast.While, ast.Try)):
            for field in ("body", "handlers", "orelse", "finalbody"):
                for child in getattr(node, field, []):
                    (self.statements(child.body) if isinstance(child, ast.ExceptHandler)
                     else self.statement(child))

    def audit(self, node):
        if node.lineno not in self.hidden:
            return
        heads = [node] if not isinstance(node, (ast.For, ast.While, ast.If, ast.With, ast.Try)) else \
            [getattr(node, f) for f in ("iter", "test") if hasattr(node, f)]
        for head in heads:
            for line, what, expr in _expected_sides(head):
                names = sorted(_reads(expr) & self.bad)
                if names:
                    self.found.append((line, what, names))


def _expected_sides(tree):
    """(line, what, expression) for each expected side in the tree (see the module docstring)."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id.startswith("check_")):
            if node.func.id == "check_true":
                continue  # its condition is a comparison, audited below
            expected = [k.value for k in node.keywords if k.arg == "expected"] or node.args[2:3]
            for expr in expected:
                yield node.lineno, f"{node.func.id}(...)'s expected value", expr
        elif isinstance(node, ast.Call) and _called(node) in CLOSENESS and len(node.args) >= 2:
            for expr in node.args[1:2]:  # isclose(answer, expected)
                yield node.lineno, f"{_called(node)}(...)'s second argument", expr
        elif isinstance(node, ast.Compare):
            for expr in node.comparators:
                yield node.lineno, "the right side of a comparison", expr
            left = node.left  # abs(answer - expected) < tolerance: the subtracted side is an expected value
            if isinstance(left, ast.Call) and _called(left) == "abs" and len(left.args) == 1:
                left = left.args[0]
            if isinstance(left, ast.BinOp) and isinstance(left.op, (ast.Sub, ast.Div)):
                yield node.lineno, "the subtracted (or dividing) side of a compared difference", left.right


CLOSENESS = ("isclose", "allclose", "assert_allclose", "array_equal")


def _called(call) -> str:
    """The last part of a call's function name: `math.isclose` -> `isclose`."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def hidden_lines(source: str) -> set[int]:
    """Line numbers (1-based) between the hidden-test markers of a test cell."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip() == BEGIN:
            inside = True
        elif line.strip() == END:
            inside = False
        elif inside:
            lines.add(number)
    return lines


def findings(nb, where="notebook") -> list[str]:
    """Every hidden check of `nb` whose expected side reads a name the notebook defines."""
    out = []
    for cell in nb.cells:
        if not _is_test(cell) or BEGIN not in cell.source:
            continue
        grade_id = cell.metadata["nbgrader"].get("grade_id", "?")
        try:
            tree = ast.parse(cell.source)
        except SyntaxError as exc:
            out.append(f"{where} {grade_id}: the test cell does not parse ({exc.msg})")
            continue
        audit = _Audit(kernel_names(nb, cell.source), hidden_lines(cell.source))
        audit.statements(tree.body)
        for line, what, names in sorted(audit.found):
            out.append(f"{where} {grade_id}, line {line}: {what} reads {', '.join(names)}, "
                       "which the notebook defines (take it from a literal, the library, "
                       "or inputs the test sets itself)")
    return out


@pytest.mark.parametrize("path", SOLUTIONS, ids=[os.path.basename(p)[:-6] for p in SOLUTIONS])
def test_hidden_tests_take_expected_values_from_literals_or_the_library(path):
    nb = nbformat.read(path, as_version=4)
    assert sum(BEGIN in c.source for c in nb.cells if _is_test(c)) > 0, \
        "no hidden test found: the audit saw nothing"
    problems = findings(nb, os.path.basename(path))
    assert not problems, "\n".join(problems)


def _toy(test_source, answer_source="x = 3\nrate = x / 2\n"):
    from nbformat.v4 import new_code_cell, new_notebook

    meta = {"nbgrader": {"grade": True, "solution": False, "locked": True, "grade_id": "test_x", "points": 1}}
    answer_meta = {"nbgrader": {"grade": False, "solution": True, "locked": False, "grade_id": "x"}}
    return new_notebook(cells=[new_code_cell("import math\nfrom longctx import flops\n", metadata={}),
                               new_code_cell(answer_source, metadata=answer_meta),
                               new_code_cell(test_source, metadata=meta)])


@pytest.mark.parametrize("hidden", [
    "check_number('x', x, rate * 2)",                       # directly
    "_r = rate / 3\ncheck_number('x', x, expected=_r * 6)",  # through a test variable
    "assert x == rate * 2",                                  # a comparison
    "check_true('x', x < rate * 4, 'no')",                   # a bound from a notebook value
    "for _a, _b in [(1, rate)]:\n    check_integer('x', x, _b)",
    "assert abs(x - rate * 2) < 1e-9",                       # a difference within a tolerance
    "assert x / rate < 2.01",                                # a ratio
    "check_true('x', math.isclose(x, rate * 2), 'no')",      # a closeness call
])
def test_the_audit_catches_a_planted_expected_value(hidden):
    nb = _toy("from longctx.grading import check_number, check_integer, check_true\n"
              f"{BEGIN}\n{hidden}\n{END}")
    assert findings(nb), hidden


@pytest.mark.parametrize("hidden", [
    "check_number('x', x, 3)",
    "check_number('f(2)', math.sqrt(x), math.sqrt(3))",     # library on a literal
    "_h = [1, 2]\nfor _a, _want in [((1,), 3)]:\n    check_integer('x', x + len(_h), _want)",
    "check_number('flops', x, flops.__name__ and 3)",       # a library name the lesson imports
    "assert abs(x - 3) < 1e-9 and math.isclose(x, 3.0)",    # difference and closeness against literals
])
def test_the_audit_accepts_literals_the_library_and_the_tests_own_inputs(hidden):
    nb = _toy(f"from longctx.grading import check_number, check_integer\n{BEGIN}\n{hidden}\n{END}")
    assert findings(nb) == [], findings(nb)


def test_visible_checks_may_read_notebook_names():
    nb = _toy(f"from longctx.grading import check_true\ncheck_true('x', 0 < x < rate * 4, 'no')\n{BEGIN}\n"
              f"check_true('x', x == 3, 'no')\n{END}")
    assert findings(nb) == []
