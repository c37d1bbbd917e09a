"""Preparing one staged submission for the sandbox (step 3 of autograder/grade.py).

The notebook was already checked in a child process (staging.validate_entry: size as written, cell
count, JSON, nbformat; only what grading uses kept). nbgrader's own preprocessors then sanitize it,
with the cells' roles restored from the lesson first (cellroles.py: test cells restored from the
release, deleted cells added back, kernelspec and metadata checked); every test cell is blanked, so the
sandbox receives the student's cells only, and each test cell's check is planned from the instructor's
source in solutions/, found by grade_id. A cell whose grade_id has no instructor test is never checked
(it scores 0). A notebook that cannot be used is replaced by the blank released lesson (graded 0, with
the reason).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import checker
from staging import clean

# Words in the student's own code that a reviewer may want to look at; they change no score.
SUSPICIOUS = ["set_custom_exc", "run_cell", "sys.modules", "builtins", "__builtins__", "__import__", "ctypes",
              "os._exit", "settrace", "setprofile", "gc.get_referrers", "inspect.currentframe",
              "sys._getframe", "TorchFunctionMode", "__torch_function__", "__class__ =", "exec(", "eval(",
              "longctx.grading", "input_transformers", "events.register", "showtraceback",
              "spec_from_file_location"]


@dataclass
class LessonInfo:
    tests: dict        # grade_id -> the instructor's test-cell source (hidden tests included)
    sources: list      # the lesson's other code cells' sources (what the checker may import)
    max_cells: int     # twice the released lesson's cells: more is a denial of service, not an answer
    metadata: dict     # the released lesson's kernelspec and language_info (a submission's are replaced)


def solution_cells(root, lesson, release_dir=None):
    """The lesson's test cells by grade_id and its other code cells, from solutions/ (LessonInfo)."""
    import nbformat

    nb = nbformat.read(os.path.join(root, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)
    tests, others = {}, []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution") and meta.get("grade_id"):
            tests[meta["grade_id"]] = cell.source
        else:
            others.append(cell.source)
    release = nbformat.read(os.path.join(release_dir, lesson, f"{lesson}.ipynb"), as_version=4) \
        if release_dir else nb
    metadata = {k: release.metadata[k] for k in ("kernelspec", "language_info") if k in release.metadata}
    return LessonInfo(tests, others, max(2 * len(release.cells), 8), metadata)


def sanitize(nb, job, config, lock=None):
    """nbgrader's sanitizing preprocessors. `lock` (the grader-wide one) is held only around the two that
    read the gradebook, whose work is the lesson's cells (one cell per grade_id once the roles are
    restored); the others, whose work grows with the submission, run outside it."""
    import contextlib

    from cellroles import (
        RestoreCellRoles,  # imports nbgrader: not at module level (checker children load this)
    )
    from nbgrader.preprocessors import (
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        OverwriteCells,
        OverwriteKernelspec,
    )

    resources = {"unique_key": job.lesson, "nbgrader": {"assignment": job.lesson, "student": job.student,
                                                        "notebook": job.lesson,
                                                        "db_url": config.CourseDirectory.db_url}}
    for klass in (ClearOutput, DeduplicateIds, RestoreCellRoles):
        nb, resources = klass(config=config).preprocess(nb, resources)
    with lock if lock is not None else contextlib.nullcontext():
        for klass in (OverwriteKernelspec, OverwriteCells):
            nb, resources = klass(config=config).preprocess(nb, resources)
    nb, resources = CheckCellMetadata(config=config).preprocess(nb, resources)
    return nb


def prepare(job, config, work, lesson: LessonInfo, problem="", lock=None):
    """Sanitize, blank the test cells, plan their checks; write ctl/input.ipynb. `problem`: why the
    validator refused the notebook ("" when it is usable); `lock`: held only around the gradebook's
    preprocessors (sanitize)."""
    import nbformat
    from nbgrader import utils

    path = os.path.join(job.staged_dir, f"{job.lesson}.ipynb")
    blank = os.path.join(work, "release", job.lesson, f"{job.lesson}.ipynb")
    try:
        if problem:
            raise ValueError(problem)
        nb = sanitize(nbformat.read(path, as_version=4), job, config, lock)
        nbformat.writes(nb)  # anything nbformat cannot write is caught here, not later
    except Exception as exc:  # noqa: BLE001
        why = clean(exc)[:300] if problem else f"{type(exc).__name__}: {clean(exc)[:200]}"
        job.notes.append(f"the notebook could not be used ({why}); it was graded as the blank lesson")
        shutil.copyfile(blank, path)  # what nbgrader's autograde reads later
        nb = sanitize(nbformat.read(path, as_version=4), job, config, lock)

    def own_code(notebook):  # every code cell the student can change (test cells are restored anyway)
        return "\n".join(c.source for c in notebook.cells if c.cell_type == "code" and
                         not (utils.is_grade(c) and not utils.is_solution(c)))

    released_code = own_code(nbformat.read(blank, as_version=4))
    job.flags = sorted({w for w in SUSPICIOUS if w in own_code(nb) and w not in released_code})
    test_cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            if gid in lesson.tests:  # the instructor's source, hidden tests included; nothing else is checked
                source = lesson.tests[gid]
                job.test_plans[index] = dict(checker.plan(source, lesson.sources), source=source,
                                             grade_id=gid)
                test_cells.append(index)
            cell.source = ""           # never enters the sandbox
            cell.metadata = nbformat.from_dict({})
            cell.outputs = []
    os.makedirs(job.ctl_dir, exist_ok=True)
    os.chmod(job.ctl_dir, 0o700)
    nbformat.write(nb, os.path.join(job.ctl_dir, "input.ipynb"))
    return test_cells
