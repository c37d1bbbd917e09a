"""Build temporary copies of the course for the autograder tests (never touches the real autograder/)."""

from __future__ import annotations

import csv
import glob
import os
import shutil
import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
# the grader is every file of autograder/ that is Python (plus its nbgrader config)
GRADER_FILES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "autograder", "*.py")))


def _meta(grade_id, *, solution=False, grade=False, locked=False, points=None):
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def toy_solution_notebook():
    """A two-exercise lesson: kv_bytes (2 points, with a hidden test) and answer_b (3 points)."""
    cells = [
        new_markdown_cell("# Toy lesson\nCompute two things.", metadata=_meta("intro", locked=True)),
        new_code_cell("def kv_bytes(n_tokens):\n    ### BEGIN SOLUTION\n    return 2 * n_tokens\n"
                      "    ### END SOLUTION",
                      metadata=_meta("kv_bytes", solution=True)),
        new_code_cell("from longctx.grading import check_number\n"
                      "check_number('kv bytes for 3 tokens', kv_bytes(3), 6, answer_kind='function', "
                      "unit='bytes')\n"
                      "### BEGIN HIDDEN TESTS\n"
                      "check_number('kv bytes for 1000 tokens', kv_bytes(1000), 2000, "
                      "answer_kind='function', unit='bytes')\n"
                      "### END HIDDEN TESTS",
                      metadata=_meta("test_kv_bytes", grade=True, locked=True, points=2)),
        new_code_cell("### BEGIN SOLUTION\nanswer_b = 42\n### END SOLUTION",
                      metadata=_meta("answer_b", solution=True)),
        new_code_cell("from longctx.grading import check_integer\n"
                      "check_integer('answer b', answer_b, 42, answer_kind='value')",
                      metadata=_meta("test_answer_b", grade=True, locked=True, points=3)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}  # as the real lessons: their code's lexer
    return nb


def make_course(tmp, lessons=("toy",), use_real_lessons=False):
    """A course copy in tmp: the grader, the library, solutions (toy or real), released lessons."""
    root = os.path.join(str(tmp), "course")
    os.makedirs(os.path.join(root, "autograder"))
    for name in GRADER_FILES:
        shutil.copy(os.path.join(REPO, "autograder", name), os.path.join(root, "autograder", name))
    shutil.copytree(os.path.join(REPO, "longctx"), os.path.join(root, "longctx"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for lesson in lessons:
        os.makedirs(os.path.join(root, "solutions", lesson))
        if use_real_lessons:
            shutil.copytree(os.path.join(REPO, "solutions", lesson), os.path.join(root, "solutions", lesson),
                            dirs_exist_ok=True)
        else:
            nbformat.write(toy_solution_notebook(),
                           os.path.join(root, "solutions", lesson, f"{lesson}.ipynb"))
        release(root, lesson)
    return root


def env():
    e = dict(os.environ)
    e["PATH"] = os.path.dirname(PY) + os.pathsep + e.get("PATH", "")
    e["PYTHONWARNINGS"] = "ignore"
    return e


def release(root, lesson):
    """nbgrader generate_assignment, in-process (an nbgrader start-up per call is slow on 2 cores)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    os.environ["PATH"] = os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")  # alembic
    config = PyFileConfigLoader("nbgrader_config.py", path=os.path.join(root, "autograder")).load_config()
    api = NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)
    result = api.generate_assignment(lesson, force=True, create=True)
    assert result["success"], result


def released(root, lesson):
    return nbformat.read(os.path.join(root, "lessons", lesson, f"{lesson}.ipynb"), as_version=4)


def solution(root, lesson):
    return nbformat.read(os.path.join(root, "solutions", lesson, f"{lesson}.ipynb"), as_version=4)


def submit(root, student, lesson, nb=None, extra_files=None):
    folder = os.path.join(root, "autograder", "submitted", student, lesson)
    os.makedirs(folder, exist_ok=True)
    if nb is not None:
        nbformat.write(nb, os.path.join(folder, f"{lesson}.ipynb"))
    for name, content in (extra_files or {}).items():
        with open(os.path.join(folder, name), "w") as fh:
            fh.write(content)
    return folder


def answer(nb, grade_id, source):
    """Replace the source of the solution cell `grade_id` (what a student types)."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = source
            return nb
    raise KeyError(grade_id)


def grade(root, *args, timeout=900):
    return subprocess.run([PY, os.path.join(root, "autograder", "grade.py"), *args], cwd=root, env=env(),
                          capture_output=True, text=True, timeout=timeout)


def read_grades(root):
    with open(os.path.join(root, "autograder", "grades.csv")) as fh:
        rows = list(csv.DictReader(fh))
    return {(r["student_id"], r["assignment"]): float(r["score"]) for r in rows}, rows


def report(root, student):
    with open(os.path.join(root, "autograder", "reports", f"{student}.txt")) as fh:
        return fh.read()


def snapshot(paths):
    """{path: bytes} of every file under the given folders, to prove nothing else changed."""
    out = {}
    for base in paths:
        for dirpath, _, filenames in os.walk(base):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if os.path.islink(path):
                    out[path] = ("link", os.readlink(path))
                    continue
                with open(path, "rb") as fh:
                    out[path] = fh.read()
    return out
