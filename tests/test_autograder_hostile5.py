"""The grader against a hostile class, round five (issue 54): nothing grows after it is measured, the
manual-grading path is bounded, aliases no folder can take. Each family fails on the grader before it.

1. a notebook whose metadata nests lists 300 deep around 900,000 zeros: the validator keeps only what grading
   uses (cells' type, id, source, nbgrader keys; the lesson's kernelspec and language_info) and writes the
   form it measured (at most 20 MiB as nbformat writes it);
2. nested `application/json` displays: outputs are measured as they are written (indented, one line per
   line of text) in the sandbox and again before the graded notebook is written;
3. blank lines for Pygments: code is highlighted with the lessons' lexer, never the notebook's, at most
   20,000 characters a cell and 2 s a page: the formgrader's page and the feedback stay quick;
4. alias squatting: aliases have a form (`-alias-` and a hash) no folder may take, a folder keeps its alias
   from run to run (autograder/.work/aliases.json), and hand-graded scores stay with the folder;
5. 3,000 empty lesson folders: skipped folders are listed 20 at a time per student, then counted;
6. a folder name padded with spaces and U+2215 cannot forge a summary row on a wrapping terminal;
7. the bookkeeping and feedback workers run in cgroups of their own, under RLIMIT_AS; the preparation
   lock covers only the gradebook's preprocessors.

The sandbox tests share two `grade.py` runs over the toy lesson (module fixture `graded`), with honest
neighbours that must keep full marks.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_output

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import cgroups  # noqa: E402
import executor_output  # noqa: E402
import sandbox  # noqa: E402
import staging  # noqa: E402

LESSON = "toy"
FULL = 5
PROBLEMS = sandbox.check()
MiB = 2**20
LAB_METADATA = {"codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
                "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
                "pygments_lexer": "ipython3", "version": "3.12.3"}
LESSON_METADATA = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
BLANKS = "x = 1\n" + "\n" * 50_000 + "y = 2\n"
# a display of nested JSON, about 190,000 characters as compact JSON, ~20 times that as nbformat writes it
JSON_BOMB = ("import IPython.display as d\nv = [0] * 3000\nfor _ in range(60):\n    v = [v, 1]\n"
             "d.display({'application/json': v, 'text/plain': 'j'}, raw=True)\n")
FORGED_ROW = "z" + " " * 70 + "mallory    toy    5\u22155    ok"


def _deep(n_zeros, depth):
    v = [0] * n_zeros
    for _ in range(depth):
        v = [v]
    return v


def _bloated(nb):
    """The notebook with lists 300 deep around 900,000 zeros in its metadata, a cell's and an attachment."""
    data = json.loads(nbformat.writes(nb))
    deep = _deep(900_000, 300)
    data["metadata"]["x"] = deep
    data["cells"][1]["metadata"]["junk"] = deep
    data["cells"][0]["attachments"] = {"a.png": {"application/json": deep}}
    return json.dumps(data, separators=(",", ":"))


class _Conn:
    def __init__(self):
        self.sent = None

    def send(self, value):
        self.sent = value

    def close(self):
        pass


# ----------------------------------------------------------------------------- 1. the validator
def test_the_validator_drops_unknown_metadata_and_writes_what_it_measured(tmp_path):
    path = tmp_path / "toy.ipynb"
    path.write_text(_bloated(h.toy_solution_notebook()))
    assert path.stat().st_size > MiB
    conn = _Conn()
    staging.validate_entry(conn, str(path), 10, None, LESSON_METADATA)
    assert conn.sent[0] == "", conn.sent
    written = path.read_bytes()
    assert len(written) < 20_000, len(written)  # the old validator wrote 277 MB (nbformat.write, indented)
    nb = nbformat.reads(written.decode(), as_version=4)
    assert written == staging.written_form(nb)
    assert dict(nb.metadata) == LESSON_METADATA
    assert all(set(c.metadata) <= {"nbgrader"} and "attachments" not in c for c in nb.cells)
    assert nb.cells[1].metadata.nbgrader["grade_id"] == "kv_bytes"


def test_a_notebook_too_large_as_written_is_refused(tmp_path):
    nb = h.toy_solution_notebook()
    nb.cells[1].source += "\n" * 3_000_000  # 6 MB as JSON, ~30 MB as nbformat writes it
    path = tmp_path / "toy.ipynb"
    path.write_text(json.dumps(nb, separators=(",", ":")))
    conn = _Conn()
    staging.validate_entry(conn, str(path), 10, None, LESSON_METADATA)
    assert "as the grader writes it" in conn.sent[0], conn.sent


def test_student_language_info_is_replaced_by_the_lessons(tmp_path):
    nb = h.toy_solution_notebook()
    nb.metadata["language_info"] = dict(LAB_METADATA, pygments_lexer="brainfuck")
    path = tmp_path / "toy.ipynb"
    nbformat.write(nb, str(path))
    assert staging.read_notebook(str(path), 10, LESSON_METADATA).metadata.language_info == {"name": "python"}


# ----------------------------------------------------------------------------- 2. outputs as written
def _written_growth(outputs):
    nb = h.toy_solution_notebook()
    before = len(nbformat.writes(nb).encode())
    nb.cells[1].outputs = outputs
    return len(nbformat.writes(nb).encode()) - before


def test_output_sizes_are_measured_as_nbformat_writes_them():
    deep = 0
    for _ in range(60):
        deep = [deep, "\u00e9\n\n"]
    cases = [new_output("display_data", data={"application/json": {"a": deep, "b": [1] * 1000},
                                              "text/plain": "x\n" * 500}, metadata={}),
             new_output("stream", name="stdout", text="\n" * 5000),
             new_output("error", ename="E", evalue="v\u2028", traceback=["a\nb"] * 20),
             new_output("execute_result", data={"text/plain": "y" * 1000}, metadata={}, execution_count=3)]
    for out in cases:
        assert executor_output.written_size(out, 10**9) >= _written_growth([out]), out["output_type"]


def test_a_nested_json_display_under_the_cap_as_json_is_cut_as_written():
    v = [0] * 3000
    for _ in range(60):
        v = [v, 1]
    content = {"data": {"application/json": v, "text/plain": "j"}, "metadata": {}}
    assert len(json.dumps(content)) < 200_000 < _written_growth([new_output("display_data", **content)])
    status = {"truncated_cells": [], "output_cut_at": None}
    caps = executor_output.OutputCaps(200_000, 20 * MiB, status)
    outs = []
    kept = caps.admit({"msg_type": "display_data", "content": content}, 3, outs, new_output)
    assert kept is None and status["truncated_cells"] == [3], status  # the old measure let it through


def test_the_bookkeeper_measures_outputs_again_before_writing():
    import bookkeeper

    big = new_output("stream", name="stdout", text="\n" * 150_000)  # 300,000 characters as JSON
    small = new_output("stream", name="stdout", text="ok\n")
    budget = {"left": 10**9, "cut": []}
    kept = bookkeeper.capped({0: [small, big, small]}, 0, budget)
    assert kept[0] == small and len(kept) == 2 and "dropped" in kept[1]["text"] and budget["cut"] == [0]
    assert _written_growth([nbformat.from_dict(o) for o in kept]) < 210_000


# ----------------------------------------------------------------------------- 3. highlighting
def _with_formgrader(root):
    shutil.copytree(os.path.join(h.REPO, "autograder", "formgrader"),
                    os.path.join(root, "autograder", "formgrader"))


FORMGRADER_PAGE = """
import json, os, sys, time
from nbconvert.exporters import HTMLExporter
from nbgrader.server_extensions.formgrader import handlers
from traitlets.config.loader import PyFileConfigLoader
root, path, lesson = sys.argv[1:4]
folder = os.path.join(root, "autograder", "formgrader")
config = PyFileConfigLoader("nbgrader_config.py", path=folder).load_config()
config.HTMLExporter.template_name = "formgrade"
config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
resources = {"assignment_id": lesson, "notebook_id": lesson, "submission_id": "s", "index": 0, "total": 1,
             "base_url": "", "student": "s", "last_name": None, "first_name": None, "notebook_path": "p"}
t0 = time.monotonic()
html, _ = HTMLExporter(config=config).from_filename(path, resources=resources)
print(json.dumps({"s": time.monotonic() - t0, "html": html}))
"""


def _formgrader_page(root, path, limit_s=60):
    """The formgrader's page for an autograded notebook, rendered as its request handler does, in a child
    (seconds, html); the test fails if it takes more than `limit_s` (the old grader's took minutes)."""
    try:
        out = subprocess.run([h.PY, "-c", FORMGRADER_PAGE, root, path, LESSON], capture_output=True,
                             text=True, timeout=limit_s, env=h.env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"the formgrader's page took more than {limit_s} s")
    assert out.returncode == 0, out.stderr[-2000:]
    page = json.loads(out.stdout.strip().split("\n")[-1])
    return page["s"], page["html"]


def test_highlighting_ignores_the_notebooks_language_and_is_bounded(tmp_path):
    import highlighting

    assert highlighting.course_lexer(h.REPO) == "python"
    python = highlighting.BoundedHighlight("python")
    highlighting.new_page()
    html = python("def f():\n    return '<b>'", language="brainfuck", metadata={"magics_language": "html"})
    assert "hl-python" in html and '<span class="k">def</span>' in html and "&lt;b&gt;" in html
    slow = highlighting.BoundedHighlight("ipython3")  # quadratic on blank lines: 12,000 take most of a minute
    highlighting.new_page(0.5)
    t0 = time.monotonic()
    html = slow("x = 1\n" + "\n" * 12_000 + "<script>")
    assert time.monotonic() - t0 < 3 and "&lt;script&gt;" in html
    highlighting.new_page()
    assert '<span class="k">' not in python("def f(): pass\n" + "#" * highlighting.MAX_HIGHLIGHT_CHARS)


def test_the_formgrader_page_of_a_blank_lines_payload_is_quick(tmp_path):
    """The formgrader renders in the instructor's Jupyter server: three cells of 50,000 blank lines with
    JupyterLab's usual metadata (IPython's lexer) took 173 s there, the server answering nothing else."""
    root = h.make_course(tmp_path)
    _with_formgrader(root)
    nb = h.toy_solution_notebook()
    nb.metadata["language_info"] = LAB_METADATA
    for _ in range(3):
        nb.cells.append(new_code_cell(BLANKS))
    path = os.path.join(str(tmp_path), f"{LESSON}.ipynb")
    nbformat.write(nb, path)
    elapsed, html = _formgrader_page(root, path)
    assert elapsed < 15, elapsed
    assert "hl-python" in html and "hl-ipython3" not in html


# ----------------------------------------------------------------------------- 4. aliases
def test_aliases_live_where_no_folder_can_and_stay_with_their_folder(tmp_path):
    base = tmp_path / "autograder" / "submitted"
    (base / "Bob Smith" / LESSON).mkdir(parents=True)
    aliases = {}
    found, skipped, ids = staging.discover(str(tmp_path), set(), set(), {LESSON}, aliases)
    bob = ids["Bob Smith"]
    assert staging.is_student_id(bob) and staging.is_alias_form(bob) and aliases == {"Bob Smith": bob}
    staging.save_aliases(str(tmp_path), aliases)
    (base / bob / LESSON).mkdir(parents=True)                 # a folder named like Bob's alias
    legacy = "Carol_Jones-7e3d8981"                           # an alias recorded by an older grader
    (base / legacy / LESSON).mkdir(parents=True)
    (base / "Carol Jones" / LESSON).mkdir(parents=True)
    recorded = dict(staging.load_aliases(str(tmp_path)), **{"Carol Jones": legacy})
    found, skipped, ids = staging.discover(str(tmp_path), set(), set(), {LESSON}, recorded)
    assert ids == {"Bob Smith": bob, "Carol Jones": legacy}, ids
    assert sorted(student for student, _, _ in found) == sorted([bob, legacy])
    refused = {lesson if student.startswith("(") else student for student, lesson, _ in skipped}
    assert refused == {ascii(bob), ascii(legacy)}, skipped


def test_aliases_an_older_grader_gave_are_kept_on_the_first_run_with_a_map(tmp_path):
    import hashlib

    (tmp_path / "autograder" / "submitted" / "Bob Smith" / LESSON).mkdir(parents=True)
    old = "Bob_Smith-" + hashlib.sha256(b"Bob Smith").hexdigest()[:8]
    assert staging.legacy_aliases(str(tmp_path), {old, "alice"}) == {"Bob Smith": old}
    assert staging.legacy_aliases(str(tmp_path), {"alice"}) == {}


def test_a_broken_alias_map_stops_the_run_with_the_reason(tmp_path):
    (tmp_path / staging.ALIASES_FILE).write_text("{not json")
    with pytest.raises(RuntimeError, match="alias map"):
        staging.load_aliases(str(tmp_path))


# ----------------------------------------------------------------------------- 5. and 6. listings
def test_skipped_folders_are_capped_per_student(tmp_path):
    student = tmp_path / "autograder" / "submitted" / "many"
    for i in range(3000):
        (student / f"lesson{i:04d}").mkdir(parents=True)
    (student / LESSON).mkdir()
    found, skipped, _ = staging.discover(str(tmp_path), set(), set(), {LESSON})
    assert found == [("many", "many", LESSON)]
    assert len(skipped) == staging.MAX_NOTES + 1 and "2,980 more" in skipped[-1][2], skipped[-3:]


def test_a_padded_folder_name_cannot_forge_a_summary_row(capsys):
    import pipeline
    import reports

    real = pipeline.Job("mallory", LESSON, max_score=5.0)
    forger = pipeline.Job("z-alias-0123abcd", LESSON, score=5.0, max_score=5.0)
    reports.print_summary([real, forger], 1.0, [("many", staging.shown(FORGED_ROW), "no such lesson")],
                          {"z-alias-0123abcd": FORGED_ROW})
    out = capsys.readouterr().out
    assert "\u2215" not in out and "\\u2215" in out
    wrapped = [line[i:i + 100] for line in out.split("\n") for i in range(0, max(len(line), 1), 100)]
    assert len([w for w in wrapped if w.startswith("mallory")]) == 1, wrapped


# ----------------------------------------------------------------------------- 7. helpers' limits
def _fake_cgroup_host(tmp_path, kind):
    """A cgroup v1 or v2 hierarchy in plain folders (the limits are written, not enforced)."""
    fake, none = tmp_path / "cg", str(tmp_path / "none")
    if kind == "v1":
        for controller in ("memory", "pids", "cpu"):
            (fake / controller).mkdir(parents=True)
        (fake / "memory" / "memory.kmem.tcp.limit_in_bytes").write_text("0\n")
        return cgroups.detect(str(fake), none, env={}, cmdline=none), "memory.limit_in_bytes"
    fake.mkdir()
    (fake / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "self-cgroup").write_text("0::/\n")
    return cgroups.detect(str(fake), str(tmp_path / "self-cgroup"), env={}, cmdline=none), "memory.max"


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_bookkeeping_workers_join_their_cgroup_under_rlimit_as(tmp_path, kind):
    from bookkeeper_client import WORKER_ADDRESS_BYTES, WORKER_MEMORY_BYTES, Bookkeeper

    host, memory_file = _fake_cgroup_host(tmp_path, kind)
    assert host.kind == kind, host
    keeper = Bookkeeper(h.REPO, str(tmp_path / "work"), host, "bookkeeper")
    try:
        assert f"cgroup {kind}" in keeper.limits_note()
        memory = keeper.cgroup.paths[0]
        assert open(os.path.join(memory, memory_file)).read() == str(WORKER_MEMORY_BYTES)
        assert keeper.ask({"op": "noop"}, 120)["ok"]
        pid = keeper.proc.pid
        procs = keeper.cgroup.procs_files()
        assert procs and [open(p).read() for p in procs] == [str(pid)] * len(procs)
        limits = open(f"/proc/{pid}/limits").read()
        assert re.search(rf"Max address space\s+{WORKER_ADDRESS_BYTES}\s", limits), limits
    finally:
        keeper.close()
    assert "NO CGROUP" in Bookkeeper(h.REPO, str(tmp_path / "work"), None).limits_note()


def test_the_preparation_lock_covers_only_the_gradebook_lookups(monkeypatch):
    import threading

    import nbgrader.preprocessors as pre
    import preparation

    lock, seen = threading.Lock(), {}

    def recorder(name):
        class Recorder:
            def __init__(self, config=None):
                pass

            def preprocess(self, nb, resources):
                seen[name] = lock.locked()
                return nb, resources
        return Recorder

    for name in ("ClearOutput", "DeduplicateIds", "OverwriteKernelspec", "OverwriteCells",
                 "CheckCellMetadata"):
        monkeypatch.setattr(pre, name, recorder(name))
    import cellroles
    monkeypatch.setattr(cellroles, "RestoreCellRoles", recorder("RestoreCellRoles"))
    job = type("J", (), {"lesson": LESSON, "student": "s"})()
    config = type("C", (), {"CourseDirectory": type("D", (), {"db_url": "sqlite://"})})()
    preparation.sanitize(nbformat.v4.new_notebook(), job, config, lock)
    assert seen == {"ClearOutput": False, "DeduplicateIds": False, "RestoreCellRoles": False,
                    "OverwriteKernelspec": True, "OverwriteCells": True, "CheckCellMetadata": False}, seen


# ----------------------------------------------------------------------------- the graded runs
@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if PROBLEMS:
        pytest.skip("; ".join(PROBLEMS))
    tmp = tmp_path_factory.mktemp("hostile5")
    root = h.make_course(tmp)
    _with_formgrader(root)
    sol, rel = (lambda: h.solution(root, LESSON)), (lambda: h.released(root, LESSON))
    h.submit(root, "honest", LESSON, sol())
    folder = h.submit(root, "bloat", LESSON)
    with open(os.path.join(folder, f"{LESSON}.ipynb"), "w") as fh:
        fh.write(_bloated(sol()))
    bomb = sol()
    bomb.cells += [new_code_cell(JSON_BOMB) for _ in range(5)]
    h.submit(root, "jsonbomb", LESSON, bomb)
    blanks = sol()
    blanks.metadata["language_info"] = LAB_METADATA
    blanks.cells += [new_code_cell(BLANKS) for _ in range(3)]
    h.submit(root, "blanks", LESSON, blanks)
    h.submit(root, "Bob Smith", LESSON, sol())
    h.submit(root, "mallory", LESSON, rel())
    h.submit(root, FORGED_ROW, LESSON, sol())
    many = h.submit(root, "many", LESSON, sol())
    for i in range(3000):
        os.makedirs(os.path.join(os.path.dirname(many), f"lesson{i:04d}"))
    timings = os.path.join(str(tmp), "t.json")
    first = h.grade(root, "--jobs", "2", "--cell-timeout-s", "60", "--timings", timings, timeout=1200)
    return root, first, timings


@pytest.fixture(scope="module")
def regraded(graded):
    """Bob's answer is hand-graded, a folder named like his alias appears, and both are graded again."""
    from nbgrader.api import Gradebook

    root, first, _ = graded
    bob, = [s for s, _ in h.read_grades(root)[0] if s.startswith("Bob_Smith")]
    with Gradebook("sqlite:///" + os.path.join(root, "autograder", "gradebook.db")) as gb:
        gb.find_grade("test_answer_b", LESSON, LESSON, bob).manual_score = 1.5
        gb.db.commit()
    h.submit(root, bob, LESSON, h.released(root, LESSON))
    second = h.grade(root, "--jobs", "2", "--student", bob, timeout=900)
    return root, bob, second


def _graded_path(root, student):
    return os.path.join(root, "autograder", "autograded", student, LESSON, f"{LESSON}.ipynb")


@pytest.mark.slow
def test_the_run_finishes_and_honest_neighbours_keep_full_marks(graded):
    root, result, _ = graded
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    grades, _ = h.read_grades(root)
    for student in ("honest", "bloat", "jsonbomb", "blanks", "many"):
        assert grades[(student, LESSON)] == FULL, h.report(root, student)
    assert grades[("mallory", LESSON)] == 0
    assert "bookkeeping and feedback workers: cgroup" in result.stdout, result.stdout[:2000]


@pytest.mark.slow
def test_nothing_grows_after_it_is_measured(graded):
    root, *_ = graded
    assert os.path.getsize(_graded_path(root, "bloat")) < 20_000  # 277 MB before
    size = os.path.getsize(_graded_path(root, "jsonbomb"))
    assert size < 5 * 210_000 + 50_000, size  # five cells within the 200,000-character cap as written
    assert "cells whose output was cut" in h.report(root, "jsonbomb")
    for student in ("honest", "bloat", "jsonbomb", "blanks"):
        page = os.path.join(root, "autograder", "feedback", student, LESSON, f"{LESSON}.html")
        assert os.path.getsize(page) < 4 * MiB, (student, os.path.getsize(page))


@pytest.mark.slow
def test_blank_lines_keep_the_feedback_and_the_formgrader_quick(graded):
    root, _result, timings = graded
    rows = {r["student"]: r for r in json.load(open(timings))["submissions"]}
    assert rows["blanks"]["feedback_s"] < 30, rows["blanks"]
    assert "feedback could not be generated" not in h.report(root, "blanks")
    elapsed, html = _formgrader_page(root, _graded_path(root, "blanks"))
    assert elapsed < 15, elapsed
    assert "hl-ipython3" not in html


@pytest.mark.slow
def test_listings_are_bounded_and_rows_cannot_be_forged(graded):
    root, result, _ = graded
    out = result.stdout
    assert len(out.split("\n")) < 150, len(out.split("\n"))  # 6,000 lines before
    assert len(h.report(root, "many").split("\n")) < 60
    assert "2,980 more folders skipped" in out
    assert "\u2215" not in out
    wrapped = [line[i:i + 100] for line in out.split("\n") for i in range(0, max(len(line), 1), 100)]
    assert len([w for w in wrapped if w.startswith("mallory")]) == 1, [w for w in wrapped if "mallory" in w]


@pytest.mark.slow
def test_a_folder_named_like_an_alias_takes_nothing(regraded):
    root, bob, result = regraded
    assert result.returncode == 0, result.stdout[-3000:]
    grades, rows = h.read_grades(root)
    assert [float(r["score"]) for r in rows if r["student_id"] == bob] == [3.5], rows  # 2 + 1.5 by hand
    assert "[graded] test_answer_b: 1.5/3 - graded by hand" in h.report(root, bob)
    assert "named like the grader's alias of another folder" in result.stdout, result.stdout[-2000:]
    assert not any(s.startswith("Bob_Smith") and s != bob for s, _ in grades), grades
