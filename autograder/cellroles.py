"""Which cells are tests, answers or plain cells: from the instructor's lesson by grade_id, never from
the submission.

nbgrader's OverwriteCells restores a cell's type, lock, points and (locked cells) source from the
gradebook, but keeps the student's `grade` and `solution` flags: an unlocked, manually graded code
answer whose copy claims `solution: false` would pass as a test cell with the student's own source.
`RestoreCellRoles` runs before OverwriteCells, in the grader's preparation and in nbgrader's autograde
alike: a cell whose grade_id is the lesson's gets the released lesson's nbgrader metadata (grade,
solution, locked, task, points), a locked one its released source too, and any other cell loses its
nbgrader metadata and is a plain cell of the student. The released lesson is the one the grader itself
generated from solutions/ (autograder/.work/release), so the roles come from solutions/ only. Restoring
a locked cell's source here keeps OverwriteCells' work (under the grader's lock) to the lesson's text.
"""

from __future__ import annotations

import copy
import os

from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

_CACHE: dict = {}


def release_roles(release_dir: str, lesson: str) -> dict:
    """{grade_id: the released cell's nbgrader metadata} of a lesson (cached by file and mtime)."""
    import nbformat

    path = os.path.join(release_dir, lesson, f"{lesson}.ipynb")
    key = (path, os.path.getmtime(path))
    if key not in _CACHE:
        roles = {}
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader")
            if meta and meta.get("grade_id"):
                roles[meta["grade_id"]] = dict(copy.deepcopy(meta), cell_type=cell.cell_type,
                                               source=cell.source)
        _CACHE[key] = roles
    return _CACHE[key]


def _flagged(meta):
    return any(meta.get(k) for k in ("grade", "solution", "locked", "task"))


def restore_roles(nb, roles: dict):
    """Give every cell the lesson's role for its grade_id (or none); returns the notebook.

    One cell per grade_id: a cell that claims a role (grade, solution, locked or task) comes before one
    that does not (as nbgrader's DeduplicateIds sees them), then the first; the others become plain cells.
    """
    metas = [cell.get("metadata", {}).get("nbgrader") for cell in nb.cells]
    claimed = {m.get("grade_id") for m in metas if isinstance(m, dict) and _flagged(m)}
    taken = set()
    for cell, meta in zip(nb.cells, metas, strict=True):
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        role = roles.get(gid)
        if role is None or gid in taken or (gid in claimed and not _flagged(meta)):
            del cell.metadata["nbgrader"]
            continue
        taken.add(gid)
        restored = {k: v for k, v in role.items() if k not in ("cell_type", "source")}
        if restored.get("locked"):  # the lesson's text, as OverwriteCells would restore it
            cell.source = role["source"]
        if "checksum" in meta and "checksum" not in restored:
            restored["checksum"] = meta["checksum"]
        cell.metadata["nbgrader"] = restored
    return nb


class RestoreCellRoles(NbGraderPreprocessor):
    """nbgrader preprocessor: `restore_roles` with the released lesson of resources' assignment."""

    release_directory = Unicode(
        "", help="the grader's own release folder (autograder/.work/release)").tag(config=True)

    def preprocess(self, nb, resources):
        lesson = resources["nbgrader"]["assignment"]
        return restore_roles(nb, release_roles(self.release_directory, lesson)), resources
