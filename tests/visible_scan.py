"""The scan behind tests/test_visible_answers.py: where a lesson's visible test source gives an answer away.

Every solution notebook's test cells are read with ``ast`` and split at ``### BEGIN HIDDEN TESTS``. In the
visible part the scan finds every *expectation*, a checked expression with the value it is held to:

- the expected argument of ``check_number`` / ``check_integer`` / ``check_array`` (third positional or
  ``expected=``);
- anywhere in the code (``check_true``'s condition, a plain ``assert``, a bound name): ``x == c``, ``x is c``,
  ``x == pytest.approx(c)``, ``x in (c,)`` (one allowed value), ``abs(x - c) < t``, ``math.isclose(x, c)``,
  ``np.isclose(x, c)`` / ``np.allclose``, and a tight range ``lo < x < hi`` (also ``x > lo and x < hi``):
  one narrower than half its midpoint is held to the midpoint;
- a bound ``x >= c`` on what the learner wrote (an answer, a function's result, a name bound from one)
  leaks where it is one-sided and its constant is a formula of literals (it then computes a quantity, e.g.
  ``blocks * 16 >= 2_048 + 64 * 6_144``), or where ``c``, undone through the arithmetic on ``x``, equals
  within 1 % a number that the hidden part checks.

Constants include formulas of literals (``8_192 * 1e5 ** (-62 / 64)``, ``math.log(4)``) and names bound to
literals in the notebook. A visible expectation leaks when

(a) it checks a value answer (a name the notebook binds inside ``### BEGIN SOLUTION``, or an item of it)
    against a constant, or against an expression that needs neither the learner's answers nor their functions;
(b) its value equals, within 1 %, a number that the hidden part of the same cell checks of an answer, of the
    lesson's own case, or of an expression the visible part checks too;
(c) it checks a notebook function on the very arguments the lesson itself calls it with (its own case)
    against a constant.

And (d): a number written in a visible string (a hint, a message, a check's name) equals, within 1 %, a
number of (b). A check whose tolerance is at least half its expected value is a range check and is allowed.
"""

from __future__ import annotations

import ast
import math
import re

VALUE_CHECKS = {"check_number", "check_integer", "check_array"}
HIDDEN = "### BEGIN HIDDEN TESTS"
SOLUTION = re.compile(r"^### BEGIN SOLUTION\n(.*?)^### END SOLUTION", re.S | re.M)
_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_MATH = {"pi": math.pi, "e": math.e, "log": math.log, "log2": math.log2, "sqrt": math.sqrt, "exp": math.exp}
_CLOSE = {"isclose": (("rel_tol", "abs_tol"), (1e-9, 0.0)), "allclose": (("rtol", "atol"), (1e-5, 1e-8))}
NOT_CONSTANT = object()
ANY = object()  # a loop variable of the lesson's own calls: matches any argument


def parse(source: str) -> ast.Module:
    return ast.parse(
        "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
    )


def constant(node, env=None):
    """The value of an expression of literals, arithmetic, ``math``/``np`` constants and functions and names
    bound to such values in ``env``; ``NOT_CONSTANT`` otherwise."""
    env = env or {}
    try:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env.get(node.id, NOT_CONSTANT)
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("math", "np")
        ):
            return _MATH.get(node.attr, NOT_CONSTANT)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = constant(node.operand, env)
            return v if v is NOT_CONSTANT else (-v if isinstance(node.op, ast.USub) else v)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = constant(node.left, env), constant(node.right, env)
            return NOT_CONSTANT if NOT_CONSTANT in (a, b) else _OPS[type(node.op)](a, b)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = [constant(e, env) for e in node.elts]
            return NOT_CONSTANT if NOT_CONSTANT in items else tuple(items)
        if isinstance(node, ast.Dict) and None not in node.keys:
            items = [
                (constant(k, env), constant(v, env)) for k, v in zip(node.keys, node.values, strict=True)
            ]
            return NOT_CONSTANT if any(NOT_CONSTANT in kv for kv in items) else tuple(sorted(items, key=repr))
        if isinstance(node, ast.Call) and not node.keywords:
            f = constant(node.func, env)
            args = [constant(a, env) for a in node.args]
            return NOT_CONSTANT if f is NOT_CONSTANT or NOT_CONSTANT in args or not callable(f) else f(*args)
    except (ArithmeticError, TypeError, ValueError):
        pass
    return NOT_CONSTANT


def numbers(value):
    if isinstance(value, bool) or value is NOT_CONSTANT:
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, tuple):
        return [x for v in value for x in numbers(v)]
    return []


def literal_env(trees) -> dict:
    env = {}
    for tree in trees:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                value = constant(node.value, env)
                if value is not NOT_CONSTANT:
                    env[node.targets[0].id] = value
    return env


def is_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _call_key(call: ast.Call, env: dict):
    args = [constant(a, env) for a in call.args] + [(k.arg, constant(k.value, env)) for k in call.keywords]
    return (
        None if any(a is NOT_CONSTANT or (isinstance(a, tuple) and NOT_CONSTANT in a) for a in args) else args
    )


def _same_case(key, lesson_key) -> bool:
    return len(key) == len(lesson_key) and all(
        b is ANY or a == b for a, b in zip(key, lesson_key, strict=True)
    )


class Lesson:
    """What the scan needs of one notebook: its functions, value answers, literal names and its own calls."""

    def __init__(self, nb):
        others = [parse(c.source) for c in nb.cells if c.cell_type == "code" and not is_test(c)]
        self.functions = {n.name for t in others for n in ast.walk(t) if isinstance(n, ast.FunctionDef)}
        self.answers = set()
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                for region in SOLUTION.findall(cell.source):
                    try:
                        tree = ast.parse(region)
                    except SyntaxError:  # an indented region: a function's body
                        continue
                    self.answers |= {
                        n.id
                        for n in ast.walk(tree)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                    }
        self.env = {k: v for k, v in literal_env(others).items() if k not in self.answers}  # answers vary
        self.calls = []  # (function, argument key): the lesson's own cases
        for tree in others:
            loops = {
                n.target.id
                for n in ast.walk(tree)
                if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.target, ast.Name)
            }
            env = {**self.env, **{name: ANY for name in loops}}
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in self.functions
                ):
                    key = _call_key(node, env)
                    if key is not None:
                        self.calls.append((node.func.id, key))

    def _uses(self, node, names) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))

    def is_answer(self, node) -> bool:
        while isinstance(node, (ast.Subscript, ast.Attribute)) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("len", "float", "int", "str", "bool")
            and node.args
        ):
            node = node.args[0] if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id in self.answers

    def own_case(self, node, env, names=frozenset()) -> bool:
        """``node`` (or an item of it) is a notebook function called on the lesson's own arguments, or a name
        in ``names`` that a test cell bound from such a call."""
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Name):
            return node.id in names
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions
        ):
            return False
        key = _call_key(node, env)
        return key is not None and any(f == node.func.id and _same_case(key, k) for f, k in self.calls)

    def derived(self, tree) -> set[str]:
        """Names ``tree`` binds from the learner's answers or functions (or from such names)."""
        names = set()
        for _ in range(3):
            for node in ast.walk(tree):
                if isinstance(node, ast.Assign) and self._uses(
                    node.value, self.answers | self.functions | names
                ):
                    names |= {
                        t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)
                    }
        return names

    def learner_made(self, node, names) -> bool:
        return self._uses(node, self.answers | self.functions | names)

    def computable(self, node) -> bool:
        """An expected value the learner could print without their answers or functions."""
        return not self._uses(node, self.answers | self.functions)


class Expect:
    """One expectation: ``checked`` held to ``value`` (the folded ``node`` where there is one)."""

    def __init__(self, line, checked, node, kind, env, rel=0.0, abs_=0.0, value=NOT_CONSTANT):
        self.line, self.checked, self.node, self.kind = line, checked, node, kind
        self.value = constant(node, env) if node is not None else value
        self.rel, self.abs = (
            constant(rel, env) if isinstance(rel, ast.AST) else rel,
            constant(abs_, env) if isinstance(abs_, ast.AST) else abs_,
        )

    def range_check(self) -> bool:
        v = self.value
        if (
            self.kind in ("range", "bound")
            or NOT_CONSTANT in (self.rel, self.abs)
            or isinstance(v, bool)
            or not isinstance(v, (int, float))
        ):
            return False
        return max(self.rel * abs(v), self.abs) >= 0.5 * abs(v) > 0


def _abs_diff(node):
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "abs"
        and node.args
        and isinstance(node.args[0], ast.BinOp)
        and isinstance(node.args[0].op, ast.Sub)
    ):
        return node.args[0].left, node.args[0].right
    return None


def _from_call(node, env):
    kw = {k.arg: k.value for k in node.keywords}
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    if isinstance(node.func, ast.Name) and name in VALUE_CHECKS:
        checked = node.args[1] if len(node.args) >= 2 else kw.get("answer")
        expected = node.args[2] if len(node.args) >= 3 else kw.get("expected")
        if checked is not None and expected is not None:
            yield Expect(
                node.lineno, checked, expected, "check", env, kw.get("rel_tol", 0.0), kw.get("abs_tol", 0.0)
            )
    elif isinstance(node.func, ast.Attribute) and name in _CLOSE and len(node.args) >= 2:
        (rel_name, abs_name), (rel, abs_) = _CLOSE[name]
        tols = (kw.get(rel_name, rel), kw.get(abs_name, abs_))
        for a, b in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
            yield Expect(node.lineno, a, b, "close", env, *tols)


def _from_compare(node, env, either, bounds):
    for left, op, right in zip([node.left] + node.comparators[:-1], node.ops, node.comparators, strict=True):
        if isinstance(op, (ast.Eq, ast.Is)) and len(node.ops) == 1:
            for a, b in ((left, right), (right, left)):
                if (
                    isinstance(b, ast.Call)
                    and getattr(b.func, "attr", getattr(b.func, "id", "")) == "approx"
                    and b.args
                ):
                    kw = {k.arg: k.value for k in b.keywords}
                    yield Expect(
                        node.lineno, a, b.args[0], "close", env, kw.get("rel", 1e-6), kw.get("abs", 0.0)
                    )
                elif ast.unparse(a) not in either:
                    yield Expect(node.lineno, a, b, "eq", env)
        elif (
            isinstance(op, ast.In)
            and isinstance(right, (ast.Tuple, ast.List, ast.Set))
            and len(right.elts) == 1
        ):
            yield Expect(node.lineno, left, right.elts[0], "member", env)
        elif isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            small, big = (left, right) if isinstance(op, (ast.Lt, ast.LtE)) else (right, left)
            if _abs_diff(small) is not None and constant(big, env) is not NOT_CONSTANT:
                a, b = _abs_diff(small)
                yield Expect(node.lineno, a, b, "close", env, 0.0, big)
                yield Expect(node.lineno, b, a, "close", env, 0.0, big)
            elif constant(big, env) is not NOT_CONSTANT and constant(small, env) is NOT_CONSTANT:
                bounds.append((node.lineno, small, big, "upper"))
            elif constant(small, env) is not NOT_CONSTANT and constant(big, env) is NOT_CONSTANT:
                bounds.append((node.lineno, big, small, "lower"))


def expectations(tree, env):
    """Every expectation of ``tree``, and its one-sided bounds as (line, expression, constant node, side)."""
    either, bounds, found = either_bool(tree), [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += list(_from_call(node, env))
    for condition in conditions(tree):
        filters = {
            id(c)
            for comp in ast.walk(condition)
            if isinstance(comp, ast.comprehension)
            for f in comp.ifs
            for c in ast.walk(f)
        }
        # a bound under `or`, `not` or inside another comparison is a case of an implication, not asserted
        loose = {
            id(c)
            for n in ast.walk(condition)
            if isinstance(n, (ast.BoolOp, ast.UnaryOp, ast.Compare))
            and (isinstance(n, ast.Compare) or isinstance(n.op, (ast.Or, ast.Not)))
            for part in (
                [n.left, *n.comparators]
                if isinstance(n, ast.Compare)
                else n.values
                if isinstance(n, ast.BoolOp)
                else [n.operand]
            )
            for c in ast.walk(part)
        }
        for node in ast.walk(condition):
            if isinstance(node, ast.Compare) and id(node) not in filters:
                found += list(_from_compare(node, env, either, bounds if id(node) not in loose else []))
    sides = {}
    for line, expr, bound, side in bounds:
        sides.setdefault(ast.unparse(expr), {"expr": expr, "line": line, "lower": [], "upper": []})[
            side
        ].append(constant(bound, env))
    for s in sides.values():
        lo, hi = (
            [v for v in s["lower"] if isinstance(v, (int, float))],
            [v for v in s["upper"] if isinstance(v, (int, float))],
        )
        if lo and hi and 0 <= min(hi) - max(lo) < 0.25 * abs(min(hi) + max(lo)):
            found.append(Expect(s["line"], s["expr"], None, "range", env, value=(min(hi) + max(lo)) / 2))
    return found, bounds


def conditions(tree):
    """What a test asserts: ``check_true``'s condition, an ``assert``'s test, a name bound to a comparison."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "check_true"
            and len(node.args) >= 2
        ):
            yield node.args[1]
        elif isinstance(node, ast.Assert):
            yield node.test
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Compare, ast.BoolOp)):
            yield node.value


def either_bool(condition) -> set[str]:
    """Expressions that ``condition`` compares with both True and False (``x is True or x is False``: a form
    check, not an answer)."""
    seen = {}
    for cmp in ast.walk(condition):
        if (
            isinstance(cmp, ast.Compare)
            and len(cmp.ops) == 1
            and isinstance(cmp.comparators[0], ast.Constant)
            and isinstance(cmp.comparators[0].value, bool)
        ):
            seen.setdefault(ast.unparse(cmp.left), set()).add(cmp.comparators[0].value)
    return {expr for expr, values in seen.items() if values == {True, False}}
