"""nbval's set-up (issue 39): what it runs, what it compares, and the script that records its outputs.

- pytest collects notebooks only as solutions/<id>/<id>.ipynb, one item per code cell, marked slow and
  notebooks (so `make test-fast` leaves them out); a lessons/ notebook named on the command line is refused;
- nbval_sanitize.cfg rewrites what varies (addresses, paths, ports, wall times) and leaves numbers alone;
- a marked cell whose output changed fails and names the cell, a raising cell fails, an address differing
  only by its value passes; a kernel starts in a scratch folder, never in the repository;
- scripts/nbval_outputs.py writes only the marked cells' outputs, matched by cell id, refuses stale ones,
  clears outputs elsewhere, and what it records passes nbval;
- every solution keeps at least two marked cells, each with a recorded output (nbval silently skips a
  marked cell that has none), and no outputs in any other cell.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import nbval_outputs  # noqa: E402
from release import lesson_ids  # noqa: E402

LESSONS = lesson_ids()
MIN_MARKED = 2


def _pytest(*args, cwd=ROOT, timeout=300):
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _toy_notebook(cells):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def _nbval_alone(folder: Path, notebook: Path):
    """nbval on a notebook outside the repository: our sanitizers, no repository conftest or config."""
    return _pytest("-c", "/dev/null", "--rootdir", str(folder), "--nbval-lax", "--nbval-current-env",
                   "--nbval-sanitize-with", str(ROOT / "nbval_sanitize.cfg"), str(notebook), cwd=folder)


# -- what pytest collects -------------------------------------------------------------------------------

def test_nbval_collects_the_solution_notebooks_only():
    done = _pytest("--collect-only", "-q", "solutions", "lessons", "autograder")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::Cell " in line]
    notebooks = {line.split("::")[0] for line in ids}
    assert notebooks == {f"solutions/{lesson}/{lesson}.ipynb" for lesson in LESSONS}
    code_cells = sum(c.cell_type == "code" for lesson in LESSONS
                     for c in nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb",
                                            as_version=4).cells)
    assert len(ids) == code_cells
    fast = _pytest("--collect-only", "-q", "-m", "not slow and not notebooks", "solutions")
    assert "::Cell " not in fast.stdout and "deselected" in fast.stdout, fast.stdout[-2000:]


def test_a_lessons_notebook_named_on_the_command_line_is_refused():
    lesson = LESSONS[0]
    done = _pytest("--collect-only", "-q", f"lessons/{lesson}/{lesson}.ipynb")
    assert done.returncode != 0 and "solution notebooks only" in done.stdout + done.stderr


def test_make_test_runs_nbval_lax_over_solutions():
    pyproject = (ROOT / "pyproject.toml").read_text()
    addopts = re.search(r'^addopts = "(.*)"$', pyproject, flags=re.M).group(1).split()
    assert {"--nbval-lax", "--nbval-current-env"} <= set(addopts) and "--durations=25" in addopts
    assert re.search(r'^testpaths = \["tests", "solutions"\]$', pyproject, flags=re.M)
    makefile = (ROOT / "Makefile").read_text()
    target = makefile[makefile.index("\ntest:"):].split("\n\n")[0]
    assert "$(PY) -m pytest" in target


# -- the sanitizers ---------------------------------------------------------------------------------------

def _sanitize(text: str) -> str:
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns((ROOT / "nbval_sanitize.cfg").read_text()):
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize(("one", "other"), [
    ("<longctx.Foo object at 0x7f3a12bc4d90>", "<longctx.Foo object at 0x55d0e1a2b3c4>"),
    ("saved /tmp/nbval-kernel-ab12/run.json", "saved /tmp/nbval-kernel-zz99/run.json"),
    ("/work/main/.venv/lib/python3.11/site-packages/torch/nn.py",
     "/opt/conda/lib/python3.11/site-packages/torch/nn.py"),
    ("read /work/main/longctx/data/recorded/a.json", "read /home/ci/clone/longctx/data/recorded/a.json"),
    ("serving on http://127.0.0.1:35625/v1", "serving on http://127.0.0.1:41000/v1"),
    ("x = 1\nWall time: 1.2 s\n", "x = 1\nWall time: 830 ms\n"),
    ("100%|##| 10/10 [00:01<00:00, 8.5it/s]", "100%|##| 10/10 [00:03<00:00, 3.1it/s]"),
    ("prefill done, wall 1.23 s", "prefill done, wall 0.97 s"),
])
def test_sanitizers_hide_what_varies(one, other):
    assert one != other and _sanitize(one) == _sanitize(other)


@pytest.mark.parametrize("text", [
    "TTFT 93.4 ms, P99 ITL 21.0 ms", "12 blocks of 16 tokens = 0x10 each", "pool 1,572,864 B = 1.50 MiB",
    "chunk took 4.7x a decode step", "lessons/05_attention_diffusion/05_attention_diffusion.ipynb",
])
def test_sanitizers_leave_deterministic_numbers_alone(text):
    assert _sanitize(text) == text


# -- nbval itself, as a contributor meets it --------------------------------------------------------------

@pytest.mark.notebooks
def test_nbval_names_a_changed_output_and_a_raising_cell(tmp_path):
    cells = [
        new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(object.__repr__(object()).replace('object', 'Probe'))",
                      execution_count=1, outputs=[new_output("stream", name="stdout",
                                                             text="<Probe Probe at 0x7f0000000001>\n")]),
        new_code_cell("# NBVAL_CHECK_OUTPUT\nprint(6 * 7)", execution_count=2,
                      outputs=[new_output("stream", name="stdout", text="41\n")]),
        new_code_cell("print('not compared: no marker')", execution_count=3,
                      outputs=[new_output("stream", name="stdout", text="anything\n")]),
        new_code_cell("raise ValueError('broken on purpose')"),
    ]
    notebook = tmp_path / "toy.ipynb"
    nbformat.write(_toy_notebook(cells), notebook)
    done = _nbval_alone(tmp_path, notebook)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-3000:]
    assert "2 failed, 2 passed" in text, text[-3000:]
    assert re.search(r"FAILED toy\.ipynb::Cell 1\b", text) and "Cell outputs differ" in text
    assert re.search(r"FAILED toy\.ipynb::Cell 3\b", text) and "broken on purpose" in text


def test_the_graded_run_keeps_every_cell_a_grade_reads():
    """tests/test_lessons_graded.py stubs a solution's heavy narrative cells except those an exercise or test
    cell reads, by name and through other cells; a cell that only re-binds a name later re-bound is free."""
    from lab_browser import read_by_graded_cells

    role = {"exercise": {"solution": True, "grade": False}, "test": {"solution": False, "grade": True}}
    sources = [("import math", ""), ("engine = build_engine()", ""), ("ttft = engine.run()", ""),
               ("ttft = 0.0", ""), ("unused = build_engine()", ""), ("answer = math.ceil(ttft)", "exercise"),
               ("assert answer >= 0", "test"), ("print(unused)", "")]
    cells = [new_code_cell(src, metadata={"nbgrader": role[kind]} if kind else {}) for src, kind in sources]
    cells.insert(2, new_markdown_cell("a narrative paragraph"))
    assert read_by_graded_cells(_toy_notebook(cells)) == {0, 4, 6, 7}   # math, ttft = 0.0, the two graded
    # a loop variable or a parameter of the reader's own is no read of an earlier cell's `r`
    sources = [("r = build_engine()", ""), ("rows = [1, 2]", ""),
               ("def f(r):\n    return r\n\n\nanswer = [f(r) for r in rows]", "exercise")]
    cells = [new_code_cell(src, metadata={"nbgrader": role[kind]} if kind else {}) for src, kind in sources]
    assert read_by_graded_cells(_toy_notebook(cells)) == {1, 2}


@pytest.mark.notebooks
def test_a_narrative_cell_that_warns_fails_with_what_it_wrote(tmp_path):
    """The repository's conftest.py (copied beside a toy course) shows warnings in nbval's kernels and fails a
    narrative cell that writes to stderr; an exercise or test cell may (a failing check prints there)."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    grade = {"grade": True, "grade_id": "t", "points": 1, "solution": False, "locked": True,
             "schema_version": 3, "task": False}
    cells = [new_code_cell("import warnings\nimport nbformat\nprint('ok')"),
             # a DeprecationWarning from a library: hidden by Python's default filters, shown with "default"
             new_code_cell("warnings.warn_explicit('a library warning', DeprecationWarning, 'lib.py', 1, "
                           "module='lib')"),
             new_code_cell("import sys\nsys.stderr.write('a test cell may')", metadata={"nbgrader": grade})]
    (tmp_path / "solutions" / "toy").mkdir(parents=True)
    nbformat.write(_toy_notebook(cells), tmp_path / "solutions" / "toy" / "toy.ipynb")
    done = _pytest("-c", "/dev/null", "--rootdir", str(tmp_path), "--nbval-lax", "--nbval-current-env",
                   "--nbval-sanitize-with", str(ROOT / "nbval_sanitize.cfg"), "solutions", cwd=tmp_path)
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "1 failed, 2 passed" in text, text[-3000:]
    assert re.search(r"FAILED solutions/toy/toy\.ipynb::Cell 1\b", text), text[-3000:]
    assert "a narrative cell wrote to stderr" in text and "DeprecationWarning: a library warning" in text


@pytest.mark.notebooks
def test_kernels_start_in_a_scratch_folder():
    """nbval would start a notebook's kernel in solutions/<id>/; the repository's conftest.py moves it."""
    from nbval import plugin
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME

    assert getattr(plugin.RunningKernel, "scratch_folders", False), \
        "the repository's conftest.py did not apply"
    kernel = plugin.RunningKernel(CURRENT_ENV_KERNEL_NAME, cwd=str(ROOT / "solutions" / LESSONS[0]))
    scratch = Path(kernel.scratch_dir)
    try:
        msg_id = kernel.execute_cell_input("import os; print(os.getcwd())", allow_stdin=False)
        kernel.await_reply(msg_id, timeout=60)
        printed = ""
        while True:
            msg = kernel.get_message("iopub", timeout=10)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                printed += msg["content"]["text"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
    finally:
        kernel.stop()
    assert Path(printed.strip()).resolve() == scratch.resolve()
    assert not scratch.resolve().is_relative_to(ROOT) and not scratch.exists()


# -- scripts/nbval_outputs.py ---------------------------------------------------------------------------

def _cell(source, cell_id, outputs=(), execution_count=None):
    cell = new_code_cell(source, outputs=list(outputs), execution_count=execution_count)
    cell.id = cell_id
    return cell


def test_merge_writes_only_marked_outputs_by_cell_id():
    printed = [new_output("stream", name="stdout", text="42\n")]
    figure = [new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]
    current = _toy_notebook([
        new_markdown_cell("# lesson"),
        _cell("# NBVAL_CHECK_OUTPUT\nprint(42)", "kept"),
        _cell("# NBVAL_CHECK_OUTPUT\nprint(43)", "edited"),        # edited while the copy ran
        _cell("# NBVAL_CHECK_OUTPUT\nprint(44)", "added"),         # added while the copy ran
        _cell("# NBVAL_CHECK_OUTPUT\nplot()", "figure"),
        _cell("# NBVAL_CHECK_OUTPUT\nax.set_title('t');  # hidden in Jupyter, shown under nbval", "quiet"),
        _cell("print('unmarked')", "plain", outputs=printed, execution_count=7),
    ])
    executed = _toy_notebook([
        new_markdown_cell("# lesson"),
        _cell("# NBVAL_CHECK_OUTPUT\nprint(42)", "kept", outputs=printed, execution_count=1),
        _cell("# NBVAL_CHECK_OUTPUT\nprint(41)", "edited", outputs=printed, execution_count=2),
        _cell("# NBVAL_CHECK_OUTPUT\nplot()", "figure", outputs=figure, execution_count=3),
        _cell("# NBVAL_CHECK_OUTPUT\nax.set_title('t');  # hidden in Jupyter, shown under nbval", "quiet",
              execution_count=4),
        _cell("print('unmarked')", "plain", outputs=printed, execution_count=5),
    ])
    changes, refusals = nbval_outputs.merge_outputs(current, executed)
    cells = {cell.id: cell for cell in current.cells}
    assert cells["kept"].outputs == printed and cells["kept"].execution_count == 1
    assert cells["edited"].outputs == [] and cells["added"].outputs == []
    assert cells["figure"].outputs[0]["data"] == {"text/plain": "<Figure>"}
    assert cells["plain"].outputs == [] and cells["plain"].execution_count is None
    assert cells["quiet"].outputs == []
    assert len(changes) == 3 and len(refusals) == 3
    assert any("quiet" in r and "ends with ';'" in r for r in refusals)
    assert any("edited" in r and "source changed" in r for r in refusals)
    assert any("added" in r and "not in the executed copy" in r for r in refusals)
    assert nbval_outputs.merge_outputs(current, executed) == ([], refusals)  # a second merge changes nothing


def test_recorded_streams_are_joined_and_images_dropped():
    pieces = [new_output("stream", name="stdout", text="a\n"),
              new_output("stream", name="stdout", text="b\n"),
              new_output("stream", name="stderr", text="w\n"),
              new_output("stream", name="stdout", text="c\n"),
              new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
    kept = nbval_outputs.recordable(pieces)
    assert [(o["name"], o["text"]) for o in kept] == [("stdout", "a\nb\n"), ("stderr", "w\n"),
                                                     ("stdout", "c\n")]
    assert pieces[0]["text"] == "a\n"  # the executed notebook is left as it was


@pytest.mark.notebooks
def test_recorded_outputs_pass_nbval_and_a_change_fails_it(tmp_path):
    lesson = "toy"
    folder = tmp_path / "solutions" / lesson
    folder.mkdir(parents=True)
    path = folder / f"{lesson}.ipynb"
    nbformat.write(_toy_notebook([
        _cell("# NBVAL_CHECK_OUTPUT\nprint(f'{2 * 30 * 3 * 64 * 2:,} B')  "
              "# K and V, 30 layers, 3 heads of 64, 2 B", "marked"),
        _cell("import os\nprint(os.getpid())", "varies"),
    ]), path)
    assert nbval_outputs.record(lesson, root=tmp_path)
    recorded = nbformat.read(path, as_version=4)
    assert recorded.cells[0].outputs[0]["text"] == "23,040 B\n" and recorded.cells[1].outputs == []
    assert _nbval_alone(tmp_path, path).returncode == 0
    # a change that alters the output
    recorded.cells[0].source = recorded.cells[0].source.replace("* 2:", "* 4:")
    nbformat.write(recorded, path)
    done = _nbval_alone(tmp_path, path)
    assert done.returncode == 1 and "Cell 0" in done.stdout and "Cell outputs differ" in done.stdout


# -- the committed solutions -----------------------------------------------------------------------------

@pytest.mark.parametrize("lesson", LESSONS)
def test_solutions_keep_outputs_exactly_where_nbval_compares_them(lesson):
    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    marked, problems = 0, []
    for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        if nbval_outputs.checks_output(cell):
            marked += 1
            if cell.execution_count is None or not cell.outputs:
                problems.append(f"code cell {index} is marked but has no recorded output "
                                "(nbval would skip it)")
        elif cell.outputs or cell.execution_count is not None:
            problems.append(f"code cell {index} carries outputs but is not marked NBVAL_CHECK_OUTPUT")
    if marked < MIN_MARKED:
        problems.append(f"{marked} cell(s) marked NBVAL_CHECK_OUTPUT, at least {MIN_MARKED} wanted")
    assert not problems, (f"solutions/{lesson}: " + "; ".join(problems)
                          + f"\n(record with: python scripts/nbval_outputs.py {lesson})")
