"""The test set-up itself: one import path for the helpers, pins mirrored, markers that select something."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_one_import_path_for_helpers():
    """`tests.model_fixtures` and `model_fixtures` would be two modules, two caches, two model loads."""
    offenders = [f"{p.name}:{n}" for p in sorted((ROOT / "tests").glob("*.py"))
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if re.match(r"\s*(from|import)\s+tests\.", line)]
    assert not offenders, ("import the test helpers by their plain names (tests/conftest.py): "
                           + ", ".join(offenders))


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        m = re.match(r"\s*-?\s*([A-Za-z0-9_.\-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_environment_yml_mirrors_requirements_txt():
    wanted = _pins((ROOT / "requirements.txt").read_text().splitlines())
    conda = _pins(line for line in (ROOT / "environment.yml").read_text().splitlines()
                  if line.startswith("      - "))
    assert conda == wanted, {k: (wanted.get(k), conda.get(k)) for k in set(wanted) | set(conda)
                             if wanted.get(k) != conda.get(k)}


def test_fast_target_deselects_the_slow_tests_and_durations_are_shown():
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\ntest-fast:"):].split("\n\n")[0]
    assert '-m "not slow and not notebooks"' in target
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "--durations=25" in pyproject and "--dist loadfile" in pyproject
