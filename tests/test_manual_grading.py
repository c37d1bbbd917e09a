"""Manually graded written answers (nbgrader's "Manually graded answer" Markdown cells) through `make grade`.

A toy course with one autograded exercise (2 points) and one written answer (3 points): the grader
autogrades the code, leaves the written answer pending (nbgrader's needs_manual_grade) and says so per
student and in the summary; the student's text is kept intact in the graded notebook and shown as text
(never as HTML) in the feedback and in the formgrader's view; a manual score entered through nbgrader's
gradebook API shows in the final total after `make grade` runs again. Needs the sandbox (root +
bubblewrap); skipped with the reason otherwise.
"""

import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

pytestmark = [pytest.mark.slow]
PROBLEMS = sandbox.check()
LESSON = "written"
RUBRIC = "Rubric: 2 points for 'one key and one value per token', 1 point for 'per layer'."
GOOD_ANSWER = ("Each new token adds **one key and one value** per layer and head,\n"
               "so the cache grows linearly: $2 L H d$ numbers per token.")
HOSTILE = ("<script>alert('M1')</script> <img src=x onerror=alert('M2')> [x](javascript:alert('M3'))\n"
           "</textarea></div><a href=\"javascript:alert('M4')\">me</a>\n```\n~~~\n"
           "{{ resources }} {% raw %}\n")
HUGE = HOSTILE + "\n".join(f"line {i}: " + "lorem ipsum " * 15 for i in range(1100))  # about 200 KB


def source_notebook():
    cells = [
        new_markdown_cell("# Written answers\nOne number, one paragraph.",
                          metadata=h._meta("intro", locked=True)),
        new_code_cell("def kv_bytes(n_tokens):\n    ### BEGIN SOLUTION\n    return 2 * n_tokens\n"
                      "    ### END SOLUTION",
                      metadata=h._meta("kv_bytes", solution=True)),
        new_code_cell("from longctx.grading import check_number\n"
                      "check_number('kv bytes for 3 tokens', kv_bytes(3), 6, answer_kind='function', "
                      "unit='bytes')\n"
                      "### BEGIN HIDDEN TESTS\n"
                      "check_number('kv bytes for 1000 tokens', kv_bytes(1000), 2000, "
                      "answer_kind='function', unit='bytes')\n"
                      "### END HIDDEN TESTS",
                      metadata=h._meta("test_kv_bytes", grade=True, locked=True, points=2)),
        new_markdown_cell("**Explain** why the KV cache grows linearly with the context.",
                          metadata=h._meta("question", locked=True)),
        # nbgrader's "Manually graded answer": the model answer and the rubric are stripped on release
        new_markdown_cell(f"### BEGIN SOLUTION\nModel answer: {GOOD_ANSWER}\n\n{RUBRIC}\n### END SOLUTION",
                          metadata=h._meta("explain_kv", solution=True, grade=True, points=3)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def path(root, kind, student, ext):
    return os.path.join(root, "autograder", kind, student, LESSON, f"{LESSON}.{ext}")


def read(p):
    with open(p, encoding="utf-8") as fh:
        return fh.read()


def answer_cell(nb):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "explain_kv")


def formgrader_view(root, student):
    """The HTML nbgrader's formgrader serves for this submission, with the configuration it would load
    when started by autograder/formgrade.sh (its working folder: autograder/formgrader)."""
    code = (
        "import sys\n"
        "from nbconvert.exporters import HTMLExporter\n"
        "from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension\n"
        "root, src, dest = sys.argv[1:4]\n"
        "fg = FormgradeExtension()\n"
        "fg.root_dir = root\n"
        "fg.initialize([])\n"
        "assert fg.url_prefix == '.', fg.url_prefix\n"
        "resources = {'assignment_id': 'written', 'notebook_id': 'written', 'submission_id': 'x', "
        "'index': 0,\n"
        "             'total': 1, 'base_url': '/', 'student': 'x', 'last_name': None, 'first_name': None,\n"
        "             'notebook_path': 'x'}\n"
        "html, _ = HTMLExporter(config=fg.config).from_filename(src, resources=resources)\n"
        "open(dest, 'w', encoding='utf-8').write(html)\n"
    )
    dest = os.path.join(root, f"formgrader-{student}.html")
    result = subprocess.run([h.PY, "-c", code, root, path(root, "autograded", student, "ipynb"), dest],
                            cwd=os.path.join(root, "autograder", "formgrader"), env=h.env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return read(dest)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if PROBLEMS:
        pytest.skip("; ".join(PROBLEMS))
    root = h.make_course(tmp_path_factory.mktemp("manual"), lessons=())
    shutil.copytree(os.path.join(h.REPO, "autograder", "formgrader"),
                    os.path.join(root, "autograder", "formgrader"))
    os.makedirs(os.path.join(root, "solutions", LESSON))
    nbformat.write(source_notebook(), os.path.join(root, "solutions", LESSON, f"{LESSON}.ipynb"))
    h.release(root, LESSON)
    code = "def kv_bytes(n_tokens):\n    return 2 * n_tokens"
    h.submit(root, "alice", LESSON, h.answer(h.answer(h.released(root, LESSON), "kv_bytes", code),
                                             "explain_kv", GOOD_ANSWER))
    hostile = h.answer(h.answer(h.released(root, LESSON), "kv_bytes", code), "explain_kv", HUGE)
    answer_cell(hostile).metadata["nbgrader"]["points"] = 100  # restored by nbgrader from the gradebook
    h.submit(root, "mallory", LESSON, hostile)
    h.submit(root, "bob", LESSON, h.released(root, LESSON))  # nothing written: 0, not pending
    result = h.grade(root, "--jobs", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = {"stdout": result.stdout, "grades": h.read_grades(root)[0],
             "reports": {s: h.report(root, s) for s in ("alice", "mallory", "bob")},
             "feedback": {s: read(path(root, "feedback", s, "html")) for s in ("alice", "mallory")},
             "autograded": {s: nbformat.read(path(root, "autograded", s, "ipynb"), as_version=4)
                            for s in ("alice", "mallory")},
             "formgrader": formgrader_view(root, "mallory")}
    return root, first


def test_release_hides_model_answer_and_rubric(graded):
    root, _ = graded
    released = answer_cell(h.released(root, LESSON))
    assert released.source == "YOUR ANSWER HERE" and "Rubric" not in released.source
    assert RUBRIC in answer_cell(h.solution(root, LESSON)).source


def test_autograded_part_scored_written_answer_pending(graded):
    root, first = graded
    # grades.csv is nbgrader's export: the pending answer counts 0 until it is graded (the summary says so)
    assert first["grades"] == {("alice", LESSON): 2.0, ("mallory", LESSON): 2.0, ("bob", LESSON): 0.0}
    from nbgrader.api import Gradebook

    with Gradebook("sqlite:///" + os.path.join(root, "autograder", "gradebook.db")) as gb:
        for student in ("alice", "mallory"):
            grade = gb.find_grade("explain_kv", LESSON, LESSON, student)
            assert grade.auto_score is None and grade.manual_score is None and grade.needs_manual_grade
            assert grade.max_score == 3.0
            assert gb.find_grade("test_kv_bytes", LESSON, LESSON, student).score == 2.0
        bob = gb.find_grade("explain_kv", LESSON, LESSON, "bob")
        assert bob.auto_score == 0.0 and not bob.needs_manual_grade


def test_report_and_summary_say_pending(graded):
    _, first = graded
    for student in ("alice", "mallory"):
        text = first["reports"][student]
        assert f"{LESSON}: 2 / 2 autograded, 3 points pending manual grading - ok" in text, text
        assert "[PENDING] explain_kv: ?/3 - written answer awaiting manual grading" in text, text
        assert "[passed] test_kv_bytes: 2/2" in text
    bob = first["reports"]["bob"]
    assert f"{LESSON}: 0 / 5 points" in bob and "[FAILED] explain_kv: 0/3 - no answer" in bob, bob
    assert "pending" not in bob.lower()
    out = first["stdout"]
    assert re.search(r"alice\s+written\s+2/2\s+ok\s+\[\+3 points pending manual grading: explain_kv\]",
                     out), out
    assert "2 written answer(s) in 2 submission(s) await manual grading" in out, out


def test_student_text_preserved_in_graded_notebook(graded):
    _, first = graded
    assert answer_cell(first["autograded"]["alice"]).source == GOOD_ANSWER
    assert answer_cell(first["autograded"]["mallory"]).source == HUGE and len(HUGE) > 190_000
    assert answer_cell(first["autograded"]["mallory"]).metadata["nbgrader"]["points"] == 3
    feedback = first["feedback"]["alice"]
    assert "one key and one value" in feedback and "Not graded yet" in feedback


def _assert_no_student_markup(html):
    for n in range(1, 5):
        for pattern in (rf"<script[^>]*>[^<]*M{n}", rf"<img[^>]*onerror[^>]*M{n}",
                        rf"<a\s[^>]*href=\"?javascript:[^\"]*M{n}"):
            assert not re.search(pattern, html, re.S), (pattern, n)
    assert "&lt;/textarea&gt;&lt;/div&gt;" in html  # the student's closing tags are text, not markup
    assert "&lt;script&gt;alert(&#39;M1&#39;)&lt;/script&gt;" in html or "&lt;script&gt;alert('M1')" in html


def test_hostile_markdown_is_inert_everywhere(graded):
    _, first = graded
    assert first["reports"]["mallory"].count("\n") < 20 and "M1" not in first["reports"]["mallory"]
    feedback = first["feedback"]["mallory"]
    _assert_no_student_markup(feedback)
    assert "line 10: lorem" in feedback and len(feedback) < 1_000_000  # shown as text, capped
    view = first["formgrader"]
    _assert_no_student_markup(view)
    assert "line 10: lorem" in view
    assert 'id="explain_kv"' in view  # the formgrader's score box for the written answer is there
    assert "<strong>Explain</strong>" in view  # the lesson's own Markdown is still rendered


def test_manual_score_gives_the_final_total(graded):
    root, _ = graded
    from nbgrader.api import Gradebook

    with Gradebook("sqlite:///" + os.path.join(root, "autograder", "gradebook.db")) as gb:
        gb.find_grade("explain_kv", LESSON, LESSON, "alice").manual_score = 2.5
        gb.find_grade("explain_kv", LESSON, LESSON, "mallory").manual_score = 0.0
        gb.db.commit()
    again = h.grade(root, "--jobs", "2")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    grades, _ = h.read_grades(root)
    assert grades == {("alice", LESSON): 4.5, ("mallory", LESSON): 2.0, ("bob", LESSON): 0.0}
    alice = h.report(root, "alice")
    assert f"{LESSON}: 4.5 / 5 points - ok" in alice and "[graded] explain_kv: 2.5/3" in alice, alice
    assert "pending" not in alice.lower() and "pending" not in h.report(root, "mallory").lower()
    assert "await manual grading" not in again.stdout and re.search(r"alice\s+written\s+4.5/5\s+ok",
                                                                    again.stdout)
    feedback = read(path(root, "feedback", "alice", "html"))
    assert "Not graded yet" not in feedback and "Score: 2.5 / 3.0" in feedback
    assert answer_cell(nbformat.read(path(root, "autograded", "alice", "ipynb"),
                                     as_version=4)).source == GOOD_ANSWER
