"""Issue 45, layering: the core (``longctx/`` but ``cli/`` and ``__main__``) never imports the CLI, no module
reaches a private name (``x._name``, ``from m import _name``) of another module, and no import circle joins
``longctx`` modules. Each check scans the source with ``ast`` (lazy imports inside functions count too), and
each is shown to catch a planted violation. ``longctx/lessons`` is checked by
``tests/test_lesson_support_contract.py`` (the core never imports lesson support).

PENDING lists what other owners are mending now, by name: a check fails on anything else.
"""

from __future__ import annotations

import ast
from pathlib import Path

import longctx

PACKAGE = Path(longctx.__file__).resolve().parent

PENDING_CLI: set[str] = set()
PENDING_PRIVATE: set[tuple[str, str]] = set()
PENDING_CIRCLES: list[set[str]] = []
# the standard library's and torch's own public spellings (torch._dynamo: mark_static and config, documented
# API; torch.cuda._sleep: the spin kernel torch's own tests queue ahead of launches to time them on the GPU)
STDLIB_PRIVATE = {"argparse._SubParsersAction", "sys._getframe", "torch._dynamo", "torch.cuda._sleep"}


def _sources() -> dict[str, ast.Module]:
    return {p.relative_to(PACKAGE).as_posix(): ast.parse(p.read_text(encoding="utf-8"), filename=str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


SOURCES = _sources()


def _is_core(module: str) -> bool:
    return not module.startswith("cli/") and module != "__main__.py"


def cli_imports(module: str, tree: ast.AST) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of ``longctx.cli`` in a core ``module``."""
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        if any(n == "longctx.cli" or n.startswith("longctx.cli.") for n in names):
            found.append((module, node.lineno))
    return found


def _package_of(module: str) -> str:
    return module.rsplit("/", 1)[0] if "/" in module else ""


def private_reaches(module: str, tree: ast.AST) -> list[tuple[str, str, int]]:
    """``(module, name, line)`` of every private name of another module that ``module`` reads: an attribute
    ``x._name`` of anything but ``self`` / ``cls``, or ``from m import _name`` (a private module of the same
    package, such as ``grading._coarse``, is the package's own)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if ast.unparse(node) in STDLIB_PRIVATE:
                continue
            found.append((module, node.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("longctx"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    own = node.module.replace(".", "/").removeprefix("longctx").strip("/") == _package_of(
                        module
                    )
                    if not own:
                        found.append((module, a.name, node.lineno))
    return found


def _module_name(module: str) -> str:
    name = "longctx." + module.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def import_graph(sources: dict[str, ast.AST]) -> dict[str, set[str]]:
    """``longctx`` module -> the ``longctx`` modules it imports (a name imported from a package counts as its
    submodule when there is one)."""
    names = {_module_name(m) for m in sources}

    def known(name: str) -> str:
        while name not in names and "." in name:
            name = name.rsplit(".", 1)[0]
        return name

    graph = {}
    for module, tree in sources.items():
        me, deps = _module_name(module), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("longctx"):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    deps.add(full if full in names else known(node.module))
            elif isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names if a.name.startswith("longctx")}
        graph[me] = deps - {me}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles of ``graph``: its strongly connected components of two modules or more."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_core_never_imports_the_cli():
    found = [hit for m, tree in SOURCES.items() if _is_core(m) and m not in PENDING_CLI
             for hit in cli_imports(m, tree)]
    assert not found, (
        "the core must not import longctx.cli (move the function the core needs into the core, "
        f"and let the CLI import it from there): {found}"
    )


def test_no_module_reaches_a_private_name_of_another():
    found = [(m, name, line) for m, tree in SOURCES.items() for m, name, line in private_reaches(m, tree)
             if (m, name) not in PENDING_PRIVATE]
    assert not found, (
        "these modules read another module's private names (give the name a public spelling, or "
        f"pass what is needed in): {found}"
    )


def test_no_import_circle():
    found = [c for c in circles(import_graph(SOURCES)) if c not in PENDING_CIRCLES]
    assert not found, f"import circles (one side should not need the other): {found}"


def test_the_scans_catch_planted_violations():
    assert cli_imports("sim/elsewhere.py", ast.parse("def f():\n    from longctx.cli.model import g\n"))
    assert cli_imports("sim/elsewhere.py", ast.parse("import longctx.cli.model\n"))
    assert private_reaches("engine/batch.py", ast.parse("t = block_manager._tables\n")) == [
        ("engine/batch.py", "_tables", 1)]
    assert private_reaches("sim/x.py", ast.parse("from longctx.model.llama import _sdpa\n"))
    assert not private_reaches("grading/checks.py", ast.parse("from longctx.grading import _messages\n"))
    assert not private_reaches("kv/x.py", ast.parse("def f(self):\n    return self._tables\n"))
    planted = {"sim/a.py": ast.parse("from longctx.sim.b import f\n"),
               "sim/b.py": ast.parse("def f():\n    from longctx.sim.a import g\n"),
               "sim/c.py": ast.parse("from longctx.sim.a import g\n")}
    assert circles(import_graph(planted)) == [{"longctx.sim.a", "longctx.sim.b"}]


def test_pending_entries_name_real_modules():
    assert all(m in SOURCES for m in PENDING_CLI) and all(m in SOURCES for m, _ in PENDING_PRIVATE)
