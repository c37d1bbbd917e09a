"""Issue 24, the import contract of lesson support: ``longctx/lessons/`` (what the lessons' cells and test
cells use: the stall scenario of lessons 01, 02 and 08, lesson 02's scheduler checks, lesson 03's allocation
simulator, the GPU figures) may import the core; the core may not import it.

The scan parses every module of ``longctx/`` with ``ast`` and follows every import statement (top level or
inside a function, absolute or relative, and ``importlib.import_module("longctx.lessons...")`` with a
literal name). A module outside ``longctx/lessons/`` fails when it imports lesson support, directly or
through the modules it imports (a core module that imports a front end which imports lesson support
fails too). Only the front ends may: the command line (``longctx/__main__.py``, ``longctx/cli/``).
The last tests feed the scan known violations, so it is seen to catch them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import longctx

PACKAGE = Path(longctx.__file__).resolve().parent
LESSONS = "longctx.lessons"
FRONT_ENDS = ("longctx.__main__", "longctx.cli")  # and below
MODULE_NAME = re.compile(r"longctx(\.\w+)+")


def _within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def package_sources(root: Path = PACKAGE) -> dict[str, str]:
    """``{dotted module name: source}`` of every module of the package (``__init__`` names its package)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("longctx", *path.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text(encoding="utf-8")
    return out


def _is_package(module: str, sources: dict[str, str]) -> bool:
    return any(m.startswith(module + ".") for m in sources)


def imports(module: str, source: str, sources: dict[str, str]) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in ``source``, resolved against the package."""
    here = module if _is_package(module, sources) else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            out.append((base, node.lineno))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names if f"{base}.{a.name}" in sources]
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and MODULE_NAME.fullmatch(node.value)
        ):
            out.append((node.value, node.lineno))  # importlib.import_module("longctx....")
    return out


def _with_parents(module: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def violations(sources: dict[str, str]) -> list[str]:
    """Every module outside lesson support and the front ends that reaches lesson support, with the path."""
    graph = {m: [(t, line) for name, line in imports(m, s, sources)
                 for t in reversed(_with_parents(name)) if t in sources]  # the named module first
             for m, s in sources.items()}
    found = []
    for start in sorted(sources):
        if _within(start, (LESSONS, *FRONT_ENDS)):
            continue
        seen, stack = {start: None}, [start]
        while stack:  # depth-first over the static imports; ``seen`` keeps (importer, line) for the path
            m = stack.pop()
            for target, line in graph[m]:
                if target in seen:
                    continue
                seen[target] = (m, line)
                if _within(target, (LESSONS,)):
                    path, at = [], target
                    while seen[at] is not None:
                        importer, ln = seen[at]
                        path.append(f"{importer}:{ln} -> {at}")
                        at = importer
                    found.append(f"{start} imports lesson support: " + ", ".join(reversed(path)))
                    stack = []
                    break
                stack.append(target)
    return found


SOURCES = package_sources()


def test_lesson_support_is_a_package_of_its_own():
    assert f"{LESSONS}" in SOURCES and len([m for m in SOURCES if m.startswith(LESSONS + ".")]) >= 5
    for old in ("longctx.stall", "longctx.allocation", "longctx.sim.exercise1", "longctx.gpu.cells",
                "longctx.engine.policy_checks", "longctx.bench.stall", "longctx.lessons.exercise1"):
        assert old not in SOURCES, f"{old} moved to {LESSONS}"


def test_each_front_end_exists():
    for front in FRONT_ENDS:
        assert front in SOURCES, f"{front} is allowed to import lesson support but no longer exists"


def test_the_core_never_imports_lesson_support():
    found = violations(SOURCES)
    assert not found, ("the core must not import longctx.lessons (move the code the core needs out of lesson "
                       "support, or import it from a front end):\n  " + "\n  ".join(found))


def test_no_core_class_keeps_a_constructor_for_lesson_support():
    from longctx.kv.block_manager import BlockManager

    assert not hasattr(BlockManager, "with_tables")  # longctx.lessons.policy_state.manager_with_tables


CAUGHT = {
    "direct": "from longctx.lessons.stall import StallScenario\n",
    "module": "import longctx.lessons.policy_checks as pc\n", "package": "from longctx import lessons\n",
    "submodule by from": "from longctx.lessons import allocation\n",
    "relative": "from ..lessons import stall\n",
    "inside a function": ("def f():\n    from longctx.lessons.gpu_cells import choose_source\n"
                          "    return choose_source\n"),
    "importlib": "import importlib\nmod = importlib.import_module('longctx.lessons.policy_state')\n",
    "through a front end": ("def f():\n    from longctx.cli.fake_front import StallScenario\n"
                            "    return StallScenario\n"),
}


@pytest.mark.parametrize("how", sorted(CAUGHT))
def test_the_scan_catches_an_import_of_lesson_support(how):
    front = {"longctx.cli.fake_front": "from longctx.lessons.stall import StallScenario\n"}  # a front end may
    sources = {**SOURCES, **front, "longctx.engine.fake": CAUGHT[how]}
    found = violations(sources)
    assert found and all(v.startswith("longctx.engine.fake imports lesson support: ") for v in found), (
        how,
        found,
    )


def test_the_scan_leaves_lesson_support_and_front_ends_free_to_import_the_core():
    sources = {**SOURCES, "longctx.lessons.fake": "from longctx.engine import Engine\n",
               "longctx.cli.fake": "from longctx.lessons.stall import StallScenario\n"}
    assert not violations(sources)
