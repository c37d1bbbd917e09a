"""lessons/ is exactly what `make release` makes from solutions/, and nothing secret reaches it.

solutions/ is the only hand-edited copy of a lesson; if someone edits a lesson in lessons/ by hand, or
forgets `make release` after changing a solution, learners would get a notebook that differs from the
one graded. These tests catch both, and catch any solution or hidden-test text leaking into lessons/.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from release import lesson_ids, release  # noqa: E402

LESSONS = lesson_ids()
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def test_every_solution_has_a_released_lesson():
    assert LESSONS, "no lessons found in solutions/"
    released = sorted(p.name for p in (ROOT / "lessons").iterdir() if p.is_dir())
    assert released == LESSONS, "lessons/ and solutions/ hold different lessons: run `make release`"


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release")
    release(out)
    return out


@pytest.mark.parametrize("lesson", LESSONS)
def test_lessons_equal_a_fresh_release(lesson, fresh_release):
    committed = ROOT / "lessons" / lesson / f"{lesson}.ipynb"
    fresh = fresh_release / lesson / f"{lesson}.ipynb"
    assert committed.read_bytes() == fresh.read_bytes(), (
        f"lessons/{lesson} differs from what `make release` produces from solutions/{lesson}: "
        "edit solutions/ only, then run `make release` and commit lessons/"
    )


@pytest.mark.parametrize("lesson", LESSONS)
def test_no_solution_or_hidden_test_text_in_lessons(lesson):
    text = (ROOT / "lessons" / lesson / f"{lesson}.ipynb").read_text()
    for marker in MARKERS:
        assert marker not in text, f"lessons/{lesson} contains {marker!r}"
    released_sources = "\n".join("".join(c["source"])
                                 for c in _cells(ROOT / "lessons" / lesson / f"{lesson}.ipynb"))
    for cell in _cells(ROOT / "solutions" / lesson / f"{lesson}.ipynb"):
        source = "".join(cell["source"])
        for block in re.findall(r"### BEGIN (?:SOLUTION|HIDDEN TESTS)\n(.*?)### END", source, flags=re.S):
            for line in block.splitlines():
                line = line.strip()
                if len(line) > 12 and not line.startswith("#"):
                    assert line not in released_sources, f"lessons/{lesson} leaks a hidden line: {line!r}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_released_lessons_have_no_outputs(lesson):
    for cell in _cells(ROOT / "lessons" / lesson / f"{lesson}.ipynb"):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def test_release_clears_outputs_that_solutions_carry(tmp_path):
    """solutions/ keeps the outputs nbval compares (NBVAL_CHECK_OUTPUT cells, scripts/nbval_outputs.py);
    nbgrader's generate_assignment must clear them, whatever a source cell carries, so learners never see
    them."""
    import nbformat
    from nbformat.v4 import new_output

    lesson = LESSONS[0]
    source = tmp_path / "course" / "solutions" / lesson
    source.mkdir(parents=True)
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for count, cell in enumerate(code, 1):
        cell.execution_count = count
        cell.outputs = [new_output("stream", name="stdout", text=f"recorded output {count}\n"),
                        new_output("execute_result", data={"text/plain": f"'result {count}'"},
                                  execution_count=count)]
    nbformat.write(nb, source / f"{lesson}.ipynb")
    out = tmp_path / "release"
    release(out, [lesson], root=tmp_path / "course")
    released = [c for c in _cells(out / lesson / f"{lesson}.ipynb") if c["cell_type"] == "code"]
    assert len(released) == len(code)
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in released)
    assert "recorded output" not in (out / lesson / f"{lesson}.ipynb").read_text()


def test_release_command_runs_from_the_makefile_entry_point(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "release.py"), "--out", str(tmp_path),
                             LESSONS[0]], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / LESSONS[0] / f"{LESSONS[0]}.ipynb").exists()


def _nbgrader_timeout(path: Path) -> tuple[int, bool]:
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    return config.Execute.timeout, config.Execute.interrupt_on_timeout


@pytest.mark.parametrize("lesson", LESSONS)
def test_learner_validate_uses_the_graders_cell_timeout(lesson):
    """`nbgrader validate` run in a lesson folder reads that folder's nbgrader_config.py (nbgrader loads the
    working directory's config): each cell gets the grader's limit, not nbgrader's 30 s default, which
    interrupted lessons 04, 05 and 07 before their longer cells finished."""
    sys.path.insert(0, str(ROOT / "autograder"))
    from sandbox import Limits

    grader = _nbgrader_timeout(ROOT / "autograder" / "nbgrader_config.py")
    assert grader == (Limits().cell_timeout_s, True), "the grader's two configurations disagree"
    learner_lab = ROOT / "binder" / "learner" / "nbgrader_config.py"   # the Validate button reads it
    assert _nbgrader_timeout(learner_lab) == grader, "binder/learner/nbgrader_config.py: another limit"
    for side in ("solutions", "lessons"):
        config = ROOT / side / lesson / "nbgrader_config.py"
        assert config.is_file(), f"{side}/{lesson} has no nbgrader_config.py for `nbgrader validate`"
        assert _nbgrader_timeout(config) == grader, f"{side}/{lesson}/nbgrader_config.py: another limit"
    assert (ROOT / "lessons" / lesson / "nbgrader_config.py").read_bytes() == (
        ROOT / "solutions" / lesson / "nbgrader_config.py").read_bytes(), "run `make release`"
