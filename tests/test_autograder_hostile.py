"""Hostile submissions (issue 6): each kind of bad notebook costs its author only, and is reported.

One temporary course, one `grade.py --jobs 2` over a folder that mixes honest and hostile submissions
built from the released toy lesson (kv_bytes: 2 points, with a hidden test; answer_b: 3 points).
"""

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(sandbox.check()), reason="; ".join(sandbox.check()) or "sandbox ok")]

KV_OK = "def kv_bytes(n_tokens):\n    return 2 * n_tokens"
B_OK = "answer_b = 42"


def build(released, kv=KV_OK, b=B_OK):
    nb = h.answer(copy.deepcopy(released), "kv_bytes", kv)
    return h.answer(nb, "answer_b", b)


def set_test_source(nb, grade_id, source):
    return h.answer(nb, grade_id, source)


def delete_cell(nb, grade_id):
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


ALWAYS_EQUAL = "class Liar:\n    def __eq__(self, o): return True\n    def __float__(self): return 6.0\n    __hash__ = object.__hash__\n"

# student -> (how to build the notebook, expected points, words the report must contain)
CASES = {
    "honest": (lambda r: build(r), 5, ["5 / 5", "ok"]),
    "blank": (lambda r: r, 0, ["0 / 5"]),
    "half": (lambda r: build(r, kv=r.cells[1].source), 3, ["3 / 5"]),
    "eq_override": (lambda r: build(r, kv=ALWAYS_EQUAL + "def kv_bytes(n):\n    return Liar()",
                                   b=ALWAYS_EQUAL + "class LyingInt(int):\n    def __eq__(s, o): return True\n"
                                     "    __hash__ = int.__hash__\nanswer_b = LyingInt(7)"), 0, ["0 / 5"]),
    "patch_checks": (lambda r: build(r, kv="import longctx.grading as g, numpy, math\n"
                                     "g.check_number = g.check_integer = lambda *a, **k: True\n"
                                     "numpy.isclose = math.isclose = lambda *a, **k: True\n"
                                     "def kv_bytes(n):\n    return 0", b="answer_b = 0"), 0,
                     ["0 / 5", "review"]),
    "swallow_errors": (lambda r: build(r, kv="get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n"
                                       "def kv_bytes(n):\n    return 0", b="answer_b = 0"), 0,
                       ["0 / 5", "set_custom_exc", "TestNotCompleted"]),
    "edited_tests": (lambda r: set_test_source(set_test_source(build(r, kv="def kv_bytes(n):\n    return 0"),
                                                               "test_kv_bytes", "pass"), "test_answer_b", "pass"),
                     3, ["3 / 5"]),
    "deleted_tests": (lambda r: delete_cell(delete_cell(build(r), "test_kv_bytes"), "test_answer_b"), 5, ["5 / 5"]),
    "infinite_loop": (lambda r: build(r, kv=KV_OK + "\nwhile True:\n    pass"), 5, ["timed out"]),
    "os_exit": (lambda r: build(r, b="import os\nos._exit(3)"), 2, ["2 / 5", "kernel"]),
    "sys_exit": (lambda r: build(r, b=B_OK + "\nimport sys\nsys.exit(1)"), 5, ["5 / 5"]),
    # numpy.empty reserves without touching: the address-space limit stops it at once (memsets are slow here)
    "memory_bomb": (lambda r: build(r, b="import numpy\nblocks = []\nwhile True:\n"
                                    "    blocks.append(numpy.empty(2**27))\nanswer_b = 42"), 2,
                    ["2 / 5", "out of memory", "MemoryError"]),
    "fork_bomb": (lambda r: build(r, kv=KV_OK + "\nimport os, time\nwhile True:\n    if os.fork() == 0:\n"
                                  "        time.sleep(600)"), 5, ["5 / 5", "process limit"]),
    "huge_print": (lambda r: build(r, kv=KV_OK + "\nprint('x' * 100_000_000)"), 5, ["5 / 5", "output"]),
    "stderr_noise": (lambda r: build(r, kv="import sys, warnings\ndef kv_bytes(n):\n"
                                     "    warnings.warn('deprecated thing')\n"
                                     "    print('debug noise', file=sys.stderr)\n    return 2 * n\n"
                                     "sys.stderr.write('noise\\n' * 1000)"), 5, ["5 / 5", "stderr"]),
    "snoop": (lambda r: build(r, b=B_OK + "\nimport os, socket\n"
                              f"targets = {TARGETS!r}\n"
                              "for t in targets:\n    try:\n        open(t, 'a').write('pwned')\n        print('WROTE', t)\n"
                              "    except Exception as e:\n        print('blocked', t, type(e).__name__)\n"
                              "    try:\n        open(t).read(10)\n        print('READ', t)\n"
                              "    except Exception as e:\n        print('blocked read', t, type(e).__name__)\n"
                              "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n    print('NETWORK')\n"
                              "except Exception as e:\n    print('no network', type(e).__name__)"), 5, ["5 / 5"]),
}
TARGETS = []  # filled in by the fixture with the temporary course's sensitive paths


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = h.make_course(tmp_path_factory.mktemp("hostile"))
    ag = os.path.join(root, "autograder")
    TARGETS[:] = [os.path.join(ag, "gradebook.db"), os.path.join(ag, "grades.csv"),
                  os.path.join(ag, "submitted", "honest", "toy", "toy.ipynb"),
                  os.path.join(ag, "submitted", "honest", "toy", "secret.txt"),
                  os.path.join(root, "solutions", "toy", "toy.ipynb"), os.path.join(root, "longctx", "grading.py"),
                  os.path.join(ag, "grade.py"), "/etc/hostname", "/root/.bashrc", "/ctl/input.ipynb"]
    released = h.released(root, "toy")
    for student, (make, _, _) in CASES.items():
        h.submit(root, student, "toy", make(copy.deepcopy(released)))
    h.submit(root, "honest", "toy", extra_files={"secret.txt": "honest's notes"})
    # a damaged notebook, a folder without the notebook, and a link to the gradebook
    folder = h.submit(root, "damaged", "toy")
    with open(os.path.join(folder, "toy.ipynb"), "w") as fh:
        fh.write("{ this is not json")
    h.submit(root, "empty", "toy", extra_files={"notes.txt": "forgot the notebook"})
    linked = h.submit(root, "linker", "toy", build(copy.deepcopy(released)))
    os.symlink(os.path.join(ag, "gradebook.db"), os.path.join(linked, "gradebook.db"))
    protected = [os.path.join(root, d) for d in ("solutions", "lessons", "longctx")] + \
        [os.path.join(ag, "submitted")] + [os.path.join(ag, f) for f in h.GRADER_FILES]
    before = h.snapshot(protected)
    result = h.grade(root, "--jobs", "2", "--cell-timeout-s", "8", "--wall-s", "300", "--memory-gib", "2",
                     "--max-processes", "128", timeout=1200)
    grades, rows = h.read_grades(root)
    return root, result, grades, rows, before, protected


def test_grader_finishes(graded):
    _, result, *_ = graded
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.parametrize("student", sorted(CASES))
def test_each_submission_earns_exactly_its_points(graded, student):
    root, result, grades, *_ = graded
    expected = CASES[student][1]
    assert grades[(student, "toy")] == expected, h.report(root, student) + result.stdout[-2000:]
    text = h.report(root, student)
    for word in CASES[student][2]:
        assert word in text, (word, text)


def test_every_submission_is_in_grades_csv(graded):
    _, _, grades, rows, *_ = graded
    students = {s for s, _ in grades}
    assert set(CASES) | {"damaged", "empty", "linker"} <= students
    assert grades[("damaged", "toy")] == 0 and grades[("empty", "toy")] == 0
    assert grades[("linker", "toy")] == 5


def test_damaged_and_linked_submissions_are_explained(graded):
    root = graded[0]
    assert "graded as the blank lesson" in h.report(root, "damaged")
    assert "not a regular file" in h.report(root, "linker")


def test_no_other_file_changed(graded):
    root, _, _, _, before, protected = graded
    assert h.snapshot(protected) == before


def test_sandbox_blocked_reads_writes_and_network(graded):
    root = graded[0]
    import nbformat

    nb = nbformat.read(os.path.join(root, "autograder", "autograded", "snoop", "toy", "toy.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "WROTE" not in text and "NETWORK" not in text, text
    allowed = ("READ /etc/hostname", f"READ {os.path.join(root, 'longctx', 'grading.py')}")  # system, library
    for line in text.splitlines():
        assert not line.startswith("READ") or line in allowed, text
    assert "no network" in text


def test_huge_print_is_truncated(graded):
    root = graded[0]
    path = os.path.join(root, "autograder", "autograded", "huge_print", "toy", "toy.ipynb")
    assert os.path.getsize(path) < 2_000_000
    assert os.path.getsize(os.path.join(root, "autograder", "feedback", "huge_print", "toy", "toy.html")) < 3_000_000


def test_progress_lines_and_summary(graded):
    _, result, *_ = graded
    n = len(CASES) + 3
    assert result.stdout.count("executed ") == n
    assert f"{n} submission(s) graded" in result.stdout
