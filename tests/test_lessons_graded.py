"""Every real lesson, graded once per variant in the sandbox, feeds the checks that nbval cannot make.

nbval (pyproject.toml's addopts, the repository's conftest.py) runs every solution notebook in a kernel beside
this module on the other xdist worker: every cell runs without error, and a cell marked NBVAL_CHECK_OUTPUT
prints its committed output. What nbval cannot see is checked here, on the grading run only (no third
execution). One session fixture (`lesson_runs`) puts a copy of the course in a temporary folder and grades
each lesson twice through `make grade`'s grader, in its sandbox, two submissions at a time (both cores):
- "solution": the source notebook from solutions/ submitted as a student's answer, with the heavy narrative
  cells that no exercise or test cell reads (lab_browser.read_by_graded_cells: by name, transitively; a
  loop variable or a parameter of the reader's own is no read) replaced by a one-line comment: they decide
  no grade, and nbval's run of the solution executes them (every cell must run, and a narrative cell must
  write nothing to stderr, warnings shown: conftest.py); running them here too would repeat that run
  (every heavy narrative cell of lessons 02, 03, 04 and 07, most of 05, 06 and 08's);
- "untouched": the released lesson from a fresh `make release`, submitted unanswered, with its heavy
  narrative cells (those the browser run skips too: `lab_browser.plan_cells`, they import torch, load the
  model, build an engine, start a server, or read what such a cell defines) replaced by a one-line comment.
  Those cells are the solution's own, word for word (same cell id and source), and run in the solution's
  graded run, where test_untouched_narrative_cells_run_cleanly checks them; running them a second time,
  unanswered, would only repeat that run (about three minutes of CPU on two cores); those the solution's
  run stubs too are nbval's to check. The cheap narrative
  cells, every exercise and every test cell of the release run as the learner first meets them.
The kernel runs with Python warnings shown (`grade.py --python-warnings default`), because a warning in a
narrative cell is exactly what a learner would see as a failure. Parametrized tests then read the grades and
the executed notebooks (`autograder/autograded/<student>/<lesson>/<lesson>.ipynb`: the sandbox's outputs in
the student's cells, the checker's verdict in each test cell), so a failure names its lesson:

- test_solution_earns_every_autograded_point / test_untouched_release_earns_zero — the round trip;
  written answers (manually graded Markdown) wait for a person: 0 in grades.csv, "pending" in the report;
- test_untouched_narrative_cells_run_cleanly — the released lesson before anything is answered: no cell
  that is neither an exercise nor a test raises or writes to stderr (was tests/test_lesson_cells.py);
- test_solution_test_cells_pass_silently — a passing test cell prints nothing (the checker's printout is
  the test cell's output).

Where the sandbox cannot run (no root or bubblewrap) the untouched releases are executed with nbconvert
instead, outside any sandbox (the course's own notebooks, not student code): the narrative-cell check still
runs and the grade checks are skipped with the reason. The solutions are not executed a second time there:
nbval has run them. LONGCTX_TEST_LESSONS=00_start_here,03_memory_wall limits the
run to some lessons while developing; `make test` never sets it.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import autograder_helpers as h
import nbformat
import pytest
from lab_browser import nbgrader_role, plan_cells, read_by_graded_cells

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

VARIANTS = ("solution", "untouched")
ALL_LESSONS = sorted(d for d in os.listdir(os.path.join(h.REPO, "solutions"))
                     if os.path.isfile(os.path.join(h.REPO, "solutions", d, f"{d}.ipynb")))
_only = [x for x in os.environ.get("LONGCTX_TEST_LESSONS", "").split(",") if x]
LESSONS = [lesson for lesson in ALL_LESSONS if not _only or lesson in _only]
SANDBOX_PROBLEMS = sandbox.check()

# the fixture's grading run is charged to the first test
pytestmark = [pytest.mark.slow, pytest.mark.notebooks, pytest.mark.timeout(2700)]


@dataclass
class LessonRuns:
    root: str
    graded: bool                                  # False: executed with nbconvert, no grades
    notebooks: dict = field(default_factory=dict)  # (variant, lesson) -> executed notebook
    rows: dict = field(default_factory=dict)       # (variant, lesson) -> grades.csv row
    states: dict = field(default_factory=dict)     # (variant, lesson) -> how its execution ended
    stubbed: dict = field(default_factory=dict)    # lesson -> {cell id: why} of the untouched release's stubs
    solution_stubbed: dict = field(default_factory=dict)  # the same for the solution's (no grade reads them)
    log: str = ""


@pytest.fixture(scope="session")
def lesson_runs(tmp_path_factory) -> LessonRuns:
    root = h.make_course(tmp_path_factory.mktemp("lessons"), lessons=LESSONS, use_real_lessons=True)
    stubbed, solution_stubbed = {}, {}
    for lesson in LESSONS:
        solution = h.solution(root, lesson)
        release = h.released(root, lesson)
        if not SANDBOX_PROBLEMS:  # graded: the solution's run executes the heavy cells its grades read
            stubbed[lesson] = _stub_heavy_narrative_cells(release)
            graded_reads = read_by_graded_cells(solution)
            solution_stubbed[lesson] = _stub_heavy_narrative_cells(solution, keep=graded_reads)
        h.submit(root, "solution", lesson, solution)
        h.submit(root, "untouched", lesson, release)
    if SANDBOX_PROBLEMS:
        return _execute_without_sandbox(root)
    # cell and notebook limits wider than `make grade`'s (120 s, 600 s): the machine is shared with the other
    # xdist worker, and the lessons' time budget is measured by `make bench` / `make binder-check`, not here
    result = h.grade(root, "--jobs", "2", "--python-warnings", "default", "--no-feedback",
                     "--cell-timeout-s", "300", "--wall-s", "1200", timeout=2600)
    runs = LessonRuns(root, graded=True, log=result.stdout[-4000:] + result.stderr[-4000:], stubbed=stubbed,
                      solution_stubbed=solution_stubbed)
    assert result.returncode == 0, runs.log
    for variant, lesson, state in re.findall(r"executed ([^/\s]+)/(\S+): (.*)", result.stdout):
        runs.states[(variant, lesson)] = state
    _, rows = h.read_grades(root)
    for row in rows:
        runs.rows[(row["student_id"], row["assignment"])] = row
    for variant in VARIANTS:
        for lesson in LESSONS:
            path = os.path.join(root, "autograder", "autograded", variant, lesson, f"{lesson}.ipynb")
            if os.path.isfile(path):
                runs.notebooks[(variant, lesson)] = nbformat.read(path, as_version=4)
    return runs


def _stub_heavy_narrative_cells(nb, keep=frozenset()) -> dict:
    """Replace, in place, the narrative cells a browser run skips (except those in `keep`) by a comment;
    {cell id: why} of each."""
    _, skipped = plan_cells(nb, run_everything=False)
    stubbed = {}
    for index, why in skipped.items():
        cell = nb.cells[index]
        if nbgrader_role(cell) == "" and index not in keep:
            stubbed[cell.get("id")] = why
            cell.source = (f"# not run in the untouched release's grading run ({why}): "
                           "see tests/test_lessons_graded.py")
    return stubbed


def _execute_without_sandbox(root) -> LessonRuns:
    """nbconvert --execute --allow-errors for every untouched release, two at a time, warnings shown."""
    runs = LessonRuns(root, graded=False)
    env = dict(h.env(), PYTHONWARNINGS="default")

    def execute(key):
        variant, lesson = key
        folder = os.path.join(root, "executed", variant, lesson)
        shutil.copytree(os.path.join(root, "autograder", "submitted", variant, lesson), folder)
        cmd = [h.PY, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--allow-errors",
               "--ExecutePreprocessor.timeout=600", "--inplace", os.path.join(folder, f"{lesson}.ipynb")]
        done = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.states[key] = "finished"
        return key, nbformat.read(os.path.join(folder, f"{lesson}.ipynb"), as_version=4)

    keys = [("untouched", lesson) for lesson in LESSONS]  # the solutions: nbval runs them
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        runs.notebooks.update(pool.map(execute, keys))
    return runs


def _executed(runs: LessonRuns, variant: str, lesson: str):
    """The executed notebook; its run must have finished (not timed out, killed or cut short)."""
    nb = runs.notebooks.get((variant, lesson))
    assert nb is not None, f"{variant}/{lesson} was not executed:\n{runs.log}"
    state = runs.states.get((variant, lesson), "")
    assert state.startswith("finished"), f"{variant}/{lesson} did not run to its end: {state!r}\n{runs.log}"
    return nb


def _errors(cell) -> list[str]:
    return [f"{o.get('ename')}: {str(o.get('evalue'))[:300]}" for o in cell.get("outputs", [])
            if o.get("output_type") == "error"]


def _stderr(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


def _needs_grades(runs: LessonRuns):
    if not runs.graded:
        pytest.skip("no grading sandbox here: " + "; ".join(SANDBOX_PROBLEMS))


def _manual_points(lesson: str) -> float:
    """Points of the manually graded answers (Markdown cells with grade and solution) of ``lesson``."""
    nb = nbformat.read(os.path.join(h.REPO, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells if c.cell_type == "markdown"]
    return float(sum(m.get("points", 0) for m in meta if m.get("grade") and m.get("solution")))


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_earns_every_autograded_point(lesson_runs, lesson):
    _needs_grades(lesson_runs)
    row = lesson_runs.rows.get(("solution", lesson))
    assert row is not None, f"no grades.csv row for solution/{lesson}:\n{lesson_runs.log}"
    manual = _manual_points(lesson)  # a written answer waits for a person: 0 in grades.csv until graded
    assert float(row["score"]) == float(row["max_score"]) - manual, \
        (row, h.report(lesson_runs.root, "solution"))
    if manual:
        assert f"{lesson}:" in h.report(lesson_runs.root, "solution")
        assert "pending manual grading" in h.report(lesson_runs.root, "solution")


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_release_earns_zero(lesson_runs, lesson):
    _needs_grades(lesson_runs)
    row = lesson_runs.rows.get(("untouched", lesson))
    assert row is not None, f"no grades.csv row for untouched/{lesson}:\n{lesson_runs.log}"
    assert float(row["score"]) == 0.0, (row, h.report(lesson_runs.root, "untouched"))
    assert float(row["max_score"]) == float(lesson_runs.rows[("solution", lesson)]["max_score"]) > 0


@pytest.mark.parametrize("lesson", LESSONS)
def test_untouched_narrative_cells_run_cleanly(lesson_runs, lesson):
    """No narrative cell raises or writes to stderr (a warning included): the cheap ones run before anything
    is answered (the untouched release), the heavy ones (stubbed there) in the solution's graded run."""
    nb = _executed(lesson_runs, "untouched", lesson)
    stubbed = lesson_runs.stubbed.get(lesson, {})
    solved = {c.get("id"): c for c in _executed(lesson_runs, "solution", lesson).cells} if stubbed else {}
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or nbgrader_role(cell) != "":
            continue
        where = f"cell {index}"
        if cell.get("id") in lesson_runs.solution_stubbed.get(lesson, {}):
            continue   # heavy and read by no grade: nbval's run of the solution checks it (conftest.py)
        if cell.get("id") in stubbed:
            cell, where = solved.get(cell.get("id")), f"cell {index} (heavy: in the solution's graded run)"
            assert cell is not None, f"{lesson}: {where} is missing from the graded solution"
        problems += [f"{where} raised {e}" for e in _errors(cell)]
        if _stderr(cell):
            problems.append(f"{where} wrote to stderr: {_stderr(cell)[:500]!r}")
    assert not problems, f"released {lesson}, unanswered:\n" + "\n".join(problems)


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_test_cells_pass_silently(lesson_runs, lesson):
    """A passing test cell prints nothing (the learner guide: silence means the visible tests passed)."""
    _needs_grades(lesson_runs)
    nb = _executed(lesson_runs, "solution", lesson)
    loud = [f"cell {index}: {_printed(cell)!r:.300}" for index, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and nbgrader_role(cell) == "test" and cell.get("outputs")]
    assert not loud, f"solution {lesson}: test cells with output:\n" + "\n".join(loud)


def _printed(cell) -> list[str]:
    """What a cell printed: its streams, text results and errors, in order."""
    return [o.get("text") or o.get("data", {}).get("text/plain") or o.get("ename", "")
            for o in cell.get("outputs", [])]
