"""`make grade` round trip on a temporary copy of the course (issue 2).

Solutions submitted as answers earn full marks, untouched released lessons earn zero, a half-answered
lesson earns exactly its partial score, and grading twice gives the same grades. Needs the sandbox
(root + bubblewrap); skipped with the reason otherwise.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

pytestmark = [pytest.mark.slow]
PROBLEMS = sandbox.check()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if PROBLEMS:
        pytest.skip("; ".join(PROBLEMS))
    root = h.make_course(tmp_path_factory.mktemp("roundtrip"))
    os.remove(os.path.join(root, "autograder", "gradebook.db"))  # a fresh clone has no gradebook
    h.submit(root, "alice", "toy", h.solution(root, "toy"))
    h.submit(root, "bob", "toy", h.released(root, "toy"))
    half = h.answer(h.released(root, "toy"), "answer_b", "answer_b = 42")
    h.submit(root, "carol", "toy", half)
    lessons_before = h.snapshot([os.path.join(root, "lessons"), os.path.join(root, "solutions")])
    first = h.grade(root, "--jobs", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    grades_first, rows = h.read_grades(root)
    with open(os.path.join(root, "autograder", "grades.csv")) as fh:
        csv_first = fh.read()
    return root, first, grades_first, rows, csv_first, lessons_before


def test_scores(graded):
    _, _, grades, _, _, _ = graded
    assert grades == {("alice", "toy"): 5.0, ("bob", "toy"): 0.0, ("carol", "toy"): 3.0}


def test_grades_csv_has_nbgraders_export_columns(graded):
    _, _, _, rows, _, _ = graded
    assert list(rows[0]) == ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name",
                             "email", "raw_score", "late_submission_penalty", "score", "max_score"]
    assert {r["max_score"] for r in rows} == {"5.0"}


def test_feedback_shows_failures_not_hidden_tests(graded):
    root = graded[0]
    for student in ("alice", "bob", "carol"):
        path = os.path.join(root, "autograder", "feedback", student, "toy", "toy.html")
        text = open(path).read()
        assert "HIDDEN TESTS" not in text and "1000 tokens" not in text, student
        assert "LONGCTX-TEST-COMPLETED" not in text and "_lcg_" not in text
    assert "NotImplementedError" in open(os.path.join(root, "autograder", "feedback", "carol", "toy",
                                                      "toy.html")).read()


def test_progress_summary_and_report(graded):
    root, first, _, _, _, _ = graded
    assert first.stdout.count("executed ") == 3
    assert "carol" in first.stdout and "3/5" in first.stdout
    text = h.report(root, "carol")
    assert "[passed] test_answer_b: 3/3" in text and "[FAILED] test_kv_bytes: 0/2" in text


def test_release_folder_untouched(graded):
    root, *_, lessons_before = graded
    assert h.snapshot([os.path.join(root, "lessons"), os.path.join(root, "solutions")]) == lessons_before


def test_grading_twice_gives_the_same_grades(graded):
    root, _, _, _, csv_first, _ = graded
    again = h.grade(root, "--jobs", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    with open(os.path.join(root, "autograder", "grades.csv")) as fh:
        assert fh.read() == csv_first


def test_missing_sandbox_is_reported_clearly(monkeypatch, capsys):
    sys.path.insert(0, os.path.join(h.REPO, "autograder"))
    import grade

    monkeypatch.setattr(grade.sandbox, "check",
                        lambda: ["bubblewrap is not installed: `apt-get install -y bubblewrap`"])
    assert grade.main(["--course-root", h.REPO]) == 2
    assert "apt-get install -y bubblewrap" in capsys.readouterr().out


def test_nbgrader_config_sets_only_options_that_exist():
    """Every `c.Class.option = ...` in nbgrader_config.py names a real trait (0.9.6 has no
    LimitOutput.max_length)."""
    import nbconvert.exporters
    import nbconvert.preprocessors
    import nbgrader.apps
    import nbgrader.converters
    import nbgrader.coursedir
    import nbgrader.preprocessors
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=os.path.join(h.REPO, "autograder")).load_config()
    modules = [nbgrader.preprocessors, nbgrader.converters, nbgrader.coursedir, nbgrader.apps,
               nbconvert.preprocessors, nbconvert.exporters]
    for section, options in config.items():
        klass = next((getattr(m, section) for m in modules if hasattr(m, section)), None)
        assert klass is not None, section
        traits = klass.class_trait_names(config=True)
        for option in options:
            assert option in traits, f"{section}.{option} is not an option of nbgrader/nbconvert"
