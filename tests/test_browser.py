"""The course as a learner meets it: JupyterLab, started as `make lab` starts it, driven in a real Chromium.

JupyterLab runs the exact command of `make lab` (read from `make -n lab`: same flags, token auth on) on a
free local port, serving a scratch copy of lessons/ (the committed notebooks never change); Chromium is
Debian's, driven by Playwright (tests/lab_browser.py). Both start once for this module and stop after.
Skipped, with the reason, only where there is no Chromium or no playwright (`make test` first runs
scripts/check_browser.sh --install, which installs Chromium with apt where it can).

What is covered:
- test_lesson_in_the_browser[NN] — every released lesson (lessons/NN_*/NN_*.ipynb; lessons added later
  are picked up): opened in JupyterLab; its code cells run one by one with Ctrl+Enter, as a learner does
  before answering anything; then saved with Ctrl+S. Checked: the plots a cell makes are shown as
  decoded <img> elements (every image the kernel sent, and at least one for every cell that creates a
  figure); no error and no stderr output outside the exercise cells; every unanswered exercise cell
  raises NotImplementedError (or NameError for a name an earlier exercise defines) and every test cell
  fails while its exercise is unanswered. Then the lesson's first exercise (the first whose answer and
  tests read nothing from a skipped cell) is answered by typing the
  instructor's answer (from solutions/) into its cell through the browser: the exercise cell and its test
  cells then run without error. Screenshots: .ci-output/screenshots/NN-first-plot.png, NN-end.png,
  NN-answered.png (NN-failure.png when a check fails).
  NOT run in the browser, to keep this module within ~4 minutes on two cores: cells that run the real
  model or another long measurement (they import torch, load the model, build an engine, start a
  server, or recompute a recorded sweep: lab_browser.HEAVY_CELL) and the cells that read what those
  define. They run through a kernel in tests/test_lessons_graded.py (in the grading sandbox); set
  LONGCTX_BROWSER_ALL_CELLS=1 to run every cell in the browser too.
- test_first_exercise_teaches_then_validates — lesson 00: the first test cell fails with
  NotImplementedError while unanswered; with a typed wrong answer (bytes per element forgotten) it fails
  with the teaching message (the value, the expected value with its unit, the hint); nbgrader's Validate
  button (its lab extension) reports the failing cell; with every exercise answered Validate reports
  success.
- test_solution_notebook_runs_to_the_end — solutions/00_start_here, opened in the browser and run with
  the Run menu's "Run All Cells": every code cell executes, none errors.
- test_learner_lab_has_no_instructor_tools — `make lab`'s JupyterLab (its configuration is binder/learner/,
  as on Binder), with fresh settings: no "Create Assignment" sidebar, no Formgrader or Course List in the
  Nbgrader menu, no news pop-up; a lesson's toolbar still has nbgrader's Validate button.
  test_instructor_lab_keeps_them — autograder/formgrade.sh's JupyterLab has the sidebar and the Formgrader.
  Screenshots: learner-lab.png, instructor-lab.png.
"""

from __future__ import annotations

import re
import shutil

import nbformat
import pytest
from lab_browser import (
    CHROMIUM_ARGS,
    ROOT,
    LabPage,
    LabServer,
    NotebookPage,
    browser_missing_reason,
    chromium_path,
    defined_and_used,
    lesson_ids,
    nbgrader_role,
    plan_cells,
    solution_answer,
)

ROOT_REASON = browser_missing_reason()
pytestmark = [pytest.mark.slow, pytest.mark.notebooks,
              pytest.mark.skipif(ROOT_REASON is not None, reason=f"no browser here: {ROOT_REASON}")]

LESSONS = lesson_ids()
SOLUTION_LESSON = "00_start_here"
# A cell that creates a figure must show it.
MAKES_FIGURE = re.compile(r"plt\.(subplots|figure)\(")
UNANSWERED_EXERCISE_ERRORS = {"NotImplementedError", "NameError"}
UNANSWERED_TEST_ERRORS = {"NotImplementedError", "NameError", "AssertionError"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("lab")
    root = scratch / "lessons"
    shutil.copytree(ROOT / "lessons", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    # a second copy of lesson 00 for the Validate test, and one solution notebook
    if (ROOT / "lessons" / SOLUTION_LESSON).is_dir():
        shutil.copytree(ROOT / "lessons" / SOLUTION_LESSON, root / "validate" / SOLUTION_LESSON)
        shutil.copytree(ROOT / "solutions" / SOLUTION_LESSON, root / "solutions" / SOLUTION_LESSON)
    with LabServer(root, scratch / "state") as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(lab, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    yield tab
    context.close()
    lab.shutdown_kernels()


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _stderr(cell) -> list:
    return [o for o in cell.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stderr"]


def _saved_images(cell) -> int:
    return sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))


def _error_text(cell) -> str:
    return "\n".join(f"{o['ename']}: {o['evalue']}" for o in _errors(cell))


def _screenshot_on_failure(notebook: NotebookPage, name: str):
    class Guard:
        def __enter__(self):
            return self

        def __exit__(self, exc_type, *rest):
            if exc_type is not None:
                try:
                    notebook.screenshot(f"{name}-failure")
                except Exception:  # the page may be gone; the original error matters
                    pass
            return False

    return Guard()


def _tests_of(nb, exercise: int) -> list[int]:
    """The test cells that belong to exercise cell `exercise`: the grade cells before the next exercise."""
    tests = []
    for index in range(exercise + 1, len(nb.cells)):
        role = nbgrader_role(nb.cells[index])
        if role == "exercise":
            break
        if role == "test":
            tests.append(index)
    return tests


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_in_the_browser(lesson, lab, page):
    relpath = f"{lesson}/{lesson}.ipynb"
    nb = nbformat.read(lab.root_dir / relpath, as_version=4)
    to_run, skipped = plan_cells(nb)
    notebook = NotebookPage(page, lab, relpath)
    with _screenshot_on_failure(notebook, lesson):
        notebook.open()
        shown, plot_shot = {}, False
        for index in to_run:
            shown[index] = notebook.run_cell(index)
            if shown[index].images and not plot_shot:
                notebook.show_output_image(index)
                notebook.screenshot(f"{lesson}-first-plot")
                plot_shot = True
        saved = notebook.save()
        notebook.screenshot(f"{lesson}-end")

        problems = []
        for index in to_run:
            cell, seen, role = saved.cells[index], shown[index], nbgrader_role(saved.cells[index])
            where = f"cell {index} ({role or 'lesson'} cell)"
            if seen.broken_images:
                problems.append(f"{where}: {seen.broken_images} image(s) did not render")
            if seen.images < _saved_images(cell):
                problems.append(f"{where}: the kernel sent {_saved_images(cell)} image(s), "
                                f"the page shows {seen.images}")
            if role == "":
                if _errors(cell):
                    problems.append(f"{where} raised {_error_text(cell)}")
                if _stderr(cell):
                    problems.append(f"{where} wrote to stderr: "
                                    f"{''.join(o['text'] for o in _stderr(cell))[:300]}")
                if MAKES_FIGURE.search(cell.source) and seen.images == 0:
                    problems.append(f"{where} makes a figure but the page shows no image")
            elif role == "exercise":
                names = {o["ename"] for o in _errors(cell)}
                if names - UNANSWERED_EXERCISE_ERRORS:
                    problems.append(f"unanswered {where} raised {_error_text(cell)} "
                                    "(expected NotImplementedError)")
            elif role == "test":
                names = {o["ename"] for o in _errors(cell)}
                if not names:
                    problems.append(f"{where} passes although its exercise is unanswered")
                elif names - UNANSWERED_TEST_ERRORS:
                    problems.append(f"{where} fails with {_error_text(cell)} while unanswered "
                                    f"(expected {', '.join(sorted(UNANSWERED_TEST_ERRORS))})")
        assert not problems, (f"{lesson} in the browser (skipped cells: {skipped}):\n  "
                              + "\n  ".join(problems))

        # The first exercise, answered through the browser, passes its visible tests.
        # (one whose answer and tests read nothing that only a skipped model cell defines)
        ran_names = set().union(*(defined_and_used(nb.cells[i].source)[0] for i in to_run))
        skipped_names = set().union(set(), *(defined_and_used(nb.cells[i].source)[0]
                                             for i in skipped)) - ran_names

        def reads_skipped(source: str) -> bool:
            defined, used = defined_and_used(source)
            return bool((used - defined) & skipped_names)

        exercises = [i for i in to_run if nbgrader_role(nb.cells[i]) == "exercise"
                     and _tests_of(nb, i) and set(_tests_of(nb, i)) <= set(to_run)
                     and not reads_skipped(solution_answer(lesson,
                                                           nb.cells[i].metadata["nbgrader"]["grade_id"]))
                     and not any(reads_skipped(nb.cells[t].source) for t in _tests_of(nb, i))]
        if not exercises:  # every exercise's test reads a skipped (model) cell: nothing more to type here
            return
        exercise = exercises[0]
        grade_id = nb.cells[exercise].metadata["nbgrader"]["grade_id"]
        notebook.set_source(exercise, solution_answer(lesson, grade_id))
        for index in [exercise, *_tests_of(nb, exercise)]:
            notebook.run_cell(index)
        saved = notebook.save()
        notebook.screenshot(f"{lesson}-answered")
        for index in [exercise, *_tests_of(nb, exercise)]:
            assert not _errors(saved.cells[index]), (
                f"{lesson} {grade_id} answered with the instructor's answer, cell {index} still fails: "
                f"{_error_text(saved.cells[index])}")


WRONG_ANSWER_FROM = "return elements * bytes_per_element"


@pytest.mark.skipif(SOLUTION_LESSON not in LESSONS, reason=f"{SOLUTION_LESSON} is not released")
def test_first_exercise_teaches_then_validates(lab, page):
    relpath = f"validate/{SOLUTION_LESSON}/{SOLUTION_LESSON}.ipynb"
    nb = nbformat.read(lab.root_dir / relpath, as_version=4)
    exercises = [i for i, c in enumerate(nb.cells) if nbgrader_role(c) == "exercise"]
    first, first_test = exercises[0], _tests_of(nb, exercises[0])[0]
    notebook = NotebookPage(page, lab, relpath)
    with _screenshot_on_failure(notebook, "00-validate"):
        notebook.open()
        for index in range(first_test + 1):
            if nb.cells[index].cell_type == "code":
                notebook.run_cell(index)
        saved = notebook.save()
        assert {o["ename"] for o in _errors(saved.cells[first_test])} == {"NotImplementedError"}

        # A classic slip: the bytes per element forgotten. The test cell says what is off and how to fix it.
        grade_id = nb.cells[first].metadata["nbgrader"]["grade_id"]
        right = solution_answer(SOLUTION_LESSON, grade_id)
        assert WRONG_ANSWER_FROM in right, f"the solution of {grade_id} changed: update the wrong answer here"
        notebook.set_source(first, right.replace(WRONG_ANSWER_FROM, "return elements"))
        notebook.run_cell(first)
        seen = notebook.run_cell(first_test)
        saved = notebook.save()
        errors = _errors(saved.cells[first_test])
        assert [o["ename"] for o in errors] == ["AssertionError"], _error_text(saved.cells[first_test])
        message = errors[0]["evalue"]
        hint = re.search(r'hint="([^"]+)"', nb.cells[first_test].source).group(1)
        for piece in ("tensor_bytes((2, 3), 4)", "got 6 B", "expected 24 B", hint):
            assert piece in message, f"the teaching message lacks {piece!r}:\n{message}"
            assert piece in seen.output_text, f"the page does not show {piece!r}"
        notebook.screenshot("00-teaching-message")

        # nbgrader's Validate button reports the failing cell ...
        text = notebook.click_validate()
        notebook.screenshot("00-validate-failed")
        notebook.close_dialog()
        assert "Success" not in text and "tensor_bytes((2, 3), 4)" in text, text

        # ... and success once every exercise is answered (typed in the browser).
        for index in exercises:
            notebook.set_source(index, solution_answer(SOLUTION_LESSON,
                                                       nb.cells[index].metadata["nbgrader"]["grade_id"]))
        notebook.save()
        text = notebook.click_validate()
        notebook.screenshot("00-validate-success")
        notebook.close_dialog()
        assert "Success! Your notebook passes all the tests." in text, text


@pytest.mark.skipif(SOLUTION_LESSON not in LESSONS, reason=f"{SOLUTION_LESSON} is not released")
def test_solution_notebook_runs_to_the_end(lab, page):
    relpath = f"solutions/{SOLUTION_LESSON}/{SOLUTION_LESSON}.ipynb"
    nb = nbformat.read(lab.root_dir / relpath, as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    notebook = NotebookPage(page, lab, relpath)
    with _screenshot_on_failure(notebook, "solution"):
        notebook.open()
        notebook.run_all_from_menu()
        notebook.wait_for_cell(code[-1], timeout_s=300)
        saved = notebook.save()
        notebook.screenshot("solution-end")
        not_run = [i for i in code if not saved.cells[i].get("execution_count")]
        failed = {i: _error_text(saved.cells[i]) for i in code if _errors(saved.cells[i])}
        assert not not_run and not failed, f"solution {SOLUTION_LESSON}: not run {not_run}, failed {failed}"


CREATE_ASSIGNMENT_PANEL = "nbgrader-create_assignemnt"   # (sic) the id nbgrader 0.9 gives its sidebar panel
INSTRUCTOR_ITEMS = ("Formgrader", "Course List", "Create Assignment")


@pytest.mark.skipif(SOLUTION_LESSON not in LESSONS, reason=f"{SOLUTION_LESSON} is not released")
def test_learner_lab_has_no_instructor_tools(lab, page):
    window = LabPage(page, lab).open()
    window.screenshot("learner-lab")
    assert not window.has_panel(CREATE_ASSIGNMENT_PANEL), window.side_tabs()
    assert not any("Create Assignment" in tab for tab in window.side_tabs()), window.side_tabs()
    if "Nbgrader" in window.menu_bar():
        items = window.menu_items("Nbgrader")
        assert not [item for item in items if item.startswith(INSTRUCTOR_ITEMS)], items
        assert "Assignment List" in items, items   # a learner's tool (on a JupyterHub)
    assert not [t for t in window.toasts() if LabPage.NEWS in t], window.toasts()
    notebook = NotebookPage(page, lab, f"{SOLUTION_LESSON}/{SOLUTION_LESSON}.ipynb").open()
    assert notebook.panel.locator('.jp-Toolbar jp-button[aria-label="Validate"]').count() == 1
    assert not [t for t in window.toasts() if LabPage.NEWS in t], window.toasts()


def test_instructor_lab_keeps_them(tmp_path, browser):
    with LabServer(ROOT, tmp_path / "state", instructor=True) as instructor:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        try:
            window = LabPage(context.new_page(), instructor).open()
            window.screenshot("instructor-lab")
            assert window.has_panel(CREATE_ASSIGNMENT_PANEL), window.side_tabs()
            items = window.menu_items("Nbgrader")
            assert "Formgrader" in items, items
        finally:
            context.close()
