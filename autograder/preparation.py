"""Preparing one staged submission for the sandbox (step 3 of autograder/grade.py).

nbgrader's own preprocessors sanitize the notebook (test cells restored from the release, deleted cells
added back, kernelspec and metadata checked); then every test cell is blanked, so the sandbox receives the
student's cells only, and each test cell's check is planned from the instructor's source in solutions/.
A notebook that cannot be read is replaced by the blank released lesson (graded 0, with the reason).
"""

from __future__ import annotations

import os
import shutil

import checker
from staging import clean, read_notebook

# Words in the student's own code that a reviewer may want to look at; they change no score.
SUSPICIOUS = ["set_custom_exc", "run_cell", "sys.modules", "builtins", "__builtins__", "__import__", "ctypes",
              "os._exit", "settrace", "setprofile", "gc.get_referrers", "inspect.currentframe", "sys._getframe",
              "TorchFunctionMode", "__torch_function__", "__class__ =", "exec(", "eval(", "longctx.grading",
              "input_transformers", "events.register", "showtraceback", "spec_from_file_location"]


def solution_cells(root, lesson):
    """(test cells by grade_id: source, the lesson's other code cells' sources) from solutions/."""
    import nbformat

    nb = nbformat.read(os.path.join(root, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)
    tests, others = {}, []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            tests[meta.get("grade_id")] = cell.source
        else:
            others.append(cell.source)
    return tests, others


def prepare(job, config, root, work, lesson_info):
    """Sanitize with nbgrader's preprocessors, blank the test cells, plan their checks; write ctl/input.ipynb."""
    import nbformat
    from nbgrader import utils
    from nbgrader.preprocessors import (
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        OverwriteCells,
        OverwriteKernelspec,
    )

    path = os.path.join(job.staged_dir, f"{job.lesson}.ipynb")
    blank = os.path.join(work, "release", job.lesson, f"{job.lesson}.ipynb")
    db_url = config.CourseDirectory.db_url

    def sanitize(nb):
        resources = {"unique_key": job.lesson, "nbgrader": {"assignment": job.lesson, "student": job.student,
                                                            "notebook": job.lesson, "db_url": db_url}}
        for klass in (ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata):
            nb, resources = klass(config=config).preprocess(nb, resources)
        return nb

    try:
        if not os.path.exists(path):
            raise ValueError(f"no {job.lesson}.ipynb in the submission")
        raw = read_notebook(path)
        nbformat.write(raw, path)  # the cleaned copy is what nbgrader's autograde reads later
        nb = sanitize(raw)
        nbformat.writes(nb)  # anything nbformat cannot write is caught here, not later
    except Exception as exc:  # noqa: BLE001
        job.notes.append(f"the notebook could not be used ({type(exc).__name__}: {clean(exc)[:200]}); "
                         "it was graded as the blank lesson")
        shutil.copyfile(blank, path)
        nb = sanitize(nbformat.read(path, as_version=4))

    def own_code(notebook):  # every code cell the student can change (test cells are restored anyway)
        return "\n".join(c.source for c in notebook.cells if c.cell_type == "code" and
                         not (utils.is_grade(c) and not utils.is_solution(c)))

    released_code = own_code(nbformat.read(blank, as_version=4))
    code = own_code(nb)
    job.flags = sorted({w for w in SUSPICIOUS if w in code and w not in released_code})

    tests, lesson_sources = lesson_info
    test_cells = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            source = tests.get(gid, cell.source)  # the instructor's source, hidden tests included
            job.test_plans[index] = dict(checker.plan(source, lesson_sources), source=source, grade_id=gid)
            test_cells.append(index)
            cell.source = ""           # never enters the sandbox
            cell.metadata = nbformat.from_dict({})
            cell.outputs = []
    os.makedirs(job.ctl_dir, exist_ok=True)
    os.chmod(job.ctl_dir, 0o700)
    nbformat.write(nb, os.path.join(job.ctl_dir, "input.ipynb"))
    return test_cells
