"""Every released lesson cell that is not an exercise or its test runs without error.

A learner opens lessons/NN/NN.ipynb and runs it before answering anything: narrative, plots and
measurements must work with the exercises still unanswered, and nothing may write to stderr (nbgrader
gives a test cell zero when it does, and a learner reads a warning as a failure).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted(p.parent.name for p in (ROOT / "lessons").glob("*/*.ipynb") if p.stem == p.parent.name)


def _is_exercise_or_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade"))


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize("lesson", LESSONS)
def test_non_exercise_cells_run_cleanly(lesson, tmp_path):
    nb = nbformat.read(ROOT / "lessons" / lesson / f"{lesson}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or _is_exercise_or_test(cell):
                continue
            client.execute_cell(cell, index)  # raises CellExecutionError with the traceback on failure
            stderr = [o for o in cell.outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
            assert not stderr, f"{lesson} cell {index} wrote to stderr: {json.dumps(stderr)[:500]}"
