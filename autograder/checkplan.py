"""Planning a test cell's check, in the grader (no student data involved): which names the checker must
import from the instructor's library and which it must ask the student's kernel for.

Names the lesson binds only by `import` statements (`specs`, `flops`, `memory`, ...) are imported by the
checker itself; every other free name of the test cell is the kernel's (a value, a function, a class).
"""

from __future__ import annotations

import ast
import builtins

BUILTIN_NAMES = frozenset(dir(builtins)) | {"__name__", "__file__", "__builtins__", "get_ipython", "display"}


def _names(tree, with_imports=True):
    """(names read, names bound) anywhere in `tree`; imports count as bindings when `with_imports`."""
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if with_imports:
                for alias in node.names:
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
    return loaded, bound


def _parse(source):
    """Parse a cell, dropping IPython magics and shell lines (`%matplotlib`, `!ls`)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def free_names(source):
    """Names a test cell reads but does not bind itself (builtins excluded)."""
    tree = _parse(source)
    if tree is None:
        return []
    loaded, bound = _names(tree)
    return sorted(loaded - bound - BUILTIN_NAMES)


def lesson_bindings(sources):
    """From the lesson's own cells: {name: import statement} for names bound only by imports, and
    the set of names bound some other way (assignment, def, class, loop), which the kernel provides."""
    imports, other = {}, set()
    for source in sources:
        tree = _parse(source)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = (alias.asname or alias.name).split(".")[0]
                    if isinstance(node, ast.Import):
                        stmt = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
                    else:
                        stmt = f"from {'.' * node.level}{node.module or ''} import {alias.name}" + \
                               (f" as {alias.asname}" if alias.asname else "")
                    imports.setdefault(name, stmt)
        other |= _names(tree, with_imports=False)[1]
    # a name the lesson both imports and assigns is the kernel's
    return {k: v for k, v in imports.items() if k not in other}, other


def plan(test_source, lesson_sources):
    """What the checker must do before running a test cell: imports to run, names to ask the kernel."""
    imports, _ = lesson_bindings(lesson_sources)
    names = free_names(test_source)
    return {"imports": [imports[n] for n in names if n in imports],
            "kernel_names": [n for n in names if n not in imports]}
