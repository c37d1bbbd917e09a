"""Hostile submissions (issues 6 and 11): wrong answers earn 0 however the kernel is subverted, honest
neighbours in the same run are graded exactly, hidden-test source reaches no student-visible output, and
the run finishes and writes every report.

One temporary course with the real lesson 00 (the cheapest lesson: ex01 `tensor_bytes` + `mlp_weight_bytes`,
2 points with hidden tests; ex02 `slip`, `mlp_weight_mib` / `mlp_weight_mb`, 1 point; ex03 the prediction
`mlp_share_prediction` and `mlp_share`, computed from `mlp_weight_bytes`, 1 point) and, when the library has
lesson 02's plain-data scheduler protocol, a mini lesson made of lesson 02's scheduler exercise and test.
One `grade.py --jobs 2` over a folder mixing honest and hostile submissions.
"""

import copy
import json
import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, os.path.dirname(__file__))
import autograder_helpers as h  # noqa: E402

sys.path.insert(0, os.path.join(h.REPO, "autograder"))
import sandbox  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(sandbox.check()), reason="; ".join(sandbox.check()) or "sandbox ok")]

L00 = "00_start_here"
EX01 = ("def tensor_bytes(shape, bytes_per_element):\n    n = 1\n    for d in shape:\n        n *= d\n"
        "    return n * bytes_per_element\n\n\nmlp_weight_bytes = tensor_bytes((4096, 14336), 2)")
EX02 = 'slip = "MB as MiB"\nmlp_weight_mib = mlp_weight_bytes / 2**20\nmlp_weight_mb = mlp_weight_bytes / 1e6'
EX02_LITERAL = 'slip = "MB as MiB"\nmlp_weight_mib = 112.0\nmlp_weight_mb = 117.440512'
WRONG01 = "def tensor_bytes(shape, bytes_per_element):\n    return 0\n\n\nmlp_weight_bytes = 0"
WRONG02 = "mlp_weight_mib = 0\nmlp_weight_mb = 0"
# right only when mlp_weight_bytes is: every attack that corrupts ex01 loses ex03 as well
EX03 = 'mlp_share_prediction = "over two thirds"\nmlp_share = 32 * 3 * (mlp_weight_bytes / 2) / 8.03e9'
# distinctive pieces of lesson 00's hidden tests (their source), which no student may ever see
HIDDEN_SOURCE = ['check_number("tensor_bytes((1000, 64), 0.5)"', "HIDDEN TESTS",
                 'check_number("MB/MiB ratio"', "2**20 / 1e6, rel_tol=1e-9"]


def build(released, ex01=EX01, ex02=EX02, ex03=EX03):
    nb = h.answer(copy.deepcopy(released), "ex01_tensor_bytes", ex01)
    return h.answer(h.answer(nb, "ex02_units", ex02), "ex03_mlp_share", ex03)


def wrong(attack01="", attack02=""):
    """Wrong answers behind an attack on the kernel: must earn 0."""
    return lambda r: build(r, attack01 + "\n" + WRONG01, attack02 + "\n" + WRONG02)


def set_test_source(nb, grade_id, source):
    return h.answer(nb, grade_id, source)


def delete_cell(nb, grade_id):
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def add_cell(nb, cell, before_grade_id):
    index = next(i for i, c in enumerate(nb.cells)
                 if c.metadata.get("nbgrader", {}).get("grade_id") == before_grade_id)
    nb.cells.insert(index, cell)
    return nb


LIAR = ("class Liar:\n    def __eq__(self, o): return True\n    def __float__(self): return 24.0\n"
        "    __hash__ = object.__hash__\nclass LyingInt(int):\n    def __eq__(s, o): return True\n"
        "    __hash__ = int.__hash__\n")
TRANSFORMER = ("ip = get_ipython()\nip.input_transformers_cleanup.append(\n"
               "    lambda lines: ['pass\\n'] if lines and 'LONGCTX' not in ''.join(lines) else lines)\n")
SPEC_PATCH = ("import importlib.util, sys, types\nfake = types.ModuleType('longctx.grading')\n"
              "for n in ('check_number', 'check_integer', 'check_array', 'check_true'):\n"
              "    setattr(fake, n, lambda *a, **k: True)\n"
              "real = importlib.util.spec_from_file_location\n"
              "class Loader:\n    def create_module(self, spec): return fake\n"
              "    def exec_module(self, m): pass\n"
              "importlib.util.spec_from_file_location = "
              "lambda name, *a, **k: importlib.util.spec_from_loader(name, Loader())\n"
              "importlib.util.module_from_spec = lambda spec: fake\nsys.modules['longctx.grading'] = fake\n")
HOOKS = ("ip = get_ipython()\nev = getattr(ip, 'eve' + 'nts')\n"
         "ev.register('pre_' + 'run_cell', "
         "lambda info: print('LONGCTX-TEST-COMPLETED-' + 'x' * 32, flush=True))\n"
         "ip.showtraceback = lambda *a, **k: None\nip.showsyntaxerror = lambda *a, **k: None\n")
# a class that passes the old in-kernel _torch_base() test and answers with the expected value it reads
# from the calling check's frame
LYING_TENSOR = (
    "import sys\nclass Meta(type):\n    pass\n"
    "class Base(metaclass=Meta):\n    pass\n"
    "Tensor = Meta('Tensor', (Base,), {'__module__': 'torch'})\n"
    "def _expected():\n    f = sys._getframe(1)\n    while f is not None:\n"
    "        if 'expected' in f.f_locals:\n            return f.f_locals['expected']\n        f = f.f_back\n"
    "    return 0\n"
    "Tensor.__torch_function__ = classmethod(lambda cls, func, types, args=(), kwargs=None: _expected())\n"
    "Tensor.__float__ = lambda self: float(_expected())\nTensor.__index__ = lambda self: int(_expected())\n"
    "Tensor.__eq__ = lambda self, other: True\nTensor.__hash__ = object.__hash__\n")
LEAK = ("import os, sys\nLEAKED = []\nip = get_ipython()\n"
        "ip.events.register('pre_run_cell', lambda info: LEAKED.append(info.raw_cell))\n"
        "ip.input_transformers_cleanup.append(lambda lines: (LEAKED.append(''.join(lines)), lines)[1])\n"
        "sys.settrace(None)\n")
LEAK_SHOW = ("print('LEAK-DUMP', LEAKED, In, list(globals()), flush=True)\n"
             "for p in ('/ctl', '/ctl/input.ipynb', '/opt/grader', '/submission'):\n"
             "    try:\n        print(p, os.listdir(p) if os.path.isdir(p) else open(p).read(2000))\n"
             "    except Exception as e:\n        print('blocked', p, type(e).__name__)\n")
XSS = ("from IPython.display import HTML, Javascript, SVG, display\n"
       "display(HTML('<script>alert(\"S1\")</script><img src=x onerror=alert(\"S2\")>'))\n"
       "display(Javascript('alert(\"S3\")'))\n"
       "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(\"S4\")</script></svg>'))\n"
       "display({'text/html': '<iframe src=javascript:alert(\"S5\")></iframe>', "
       "'text/plain': 'x'}, raw=True)\n")
XSS_MARKDOWN = ("<script>alert('S6')</script> <img src=x onerror=alert('S7')> "
                "[click](javascript:alert('S8'))\n\n"
                "<a href=\"javascript:alert('S9')\">me</a>")
ANSI_FLOOD = "from IPython.display import display\ndisplay({'text/plain': '\\x1b[31m' * 650_000}, raw=True)\n"
FORK_SLEEPERS = ("import os, time\nfor _ in range(120):\n    if os.fork() == 0:\n        time.sleep(600)\n"
                 "        os._exit(0)\n")
COUNT_CHILDREN = ("import os\nalive = 0\nfor pid in os.listdir('/proc'):\n    if pid.isdigit():\n"
                  "        try:\n"
                  "            alive += open(f'/proc/{pid}/stat').read().split()[3] == str(os.getpid())\n"
                  "        except OSError:\n            pass\nprint('CHILDREN', alive)\n")
CPU_HOG = ("import os, time\nt0 = time.time(); kids = []\nfor _ in range(4):\n    pid = os.fork()\n"
           "    if pid == 0:\n        end = time.time() + 2\n"
           "        while time.time() < end:\n            pass\n"
           "        os._exit(0)\n    kids.append(pid)\nfor pid in kids:\n    os.waitpid(pid, 0)\n"
           "wall = time.time() - t0\nc = os.times()\n"
           "print(f'CPU_RATIO {(c.children_user + c.children_system) / wall:.2f}')\n"
           "import resource\nprint('RLIMIT_CPU', resource.getrlimit(resource.RLIMIT_CPU))\n")

# student -> (how to build the notebook, expected points, words the report must contain)
CASES = {
    "honest": (lambda r: build(r), 4, ["4 / 4", "ok"]),
    "blank": (lambda r: r, 0, ["0 / 4"]),
    "half": (lambda r: build(r, ex02=r.cells[13].source), 3, ["3 / 4"]),
    "literal": (lambda r: build(r, ex01=WRONG01, ex02=EX02_LITERAL), 1, ["1 / 4"]),
    # attacks of issue 6
    "eq_override": (lambda r: build(r, LIAR + "def tensor_bytes(s, b):\n    return Liar()\n"
                                    "mlp_weight_bytes = Liar()",
                                    LIAR + "mlp_weight_mib = LyingInt(7)\nmlp_weight_mb = Liar()"), 0,
                    ["0 / 4", "not plain data"]),
    "patch_checks": (wrong("import longctx.grading as g, numpy, math\n"
                           "g.check_number = g.check_integer = lambda *a, **k: True\n"
                           "numpy.isclose = math.isclose = lambda *a, **k: True\n"), 0, ["0 / 4"]),
    "swallow_errors": (wrong("get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n"), 0,
                       ["0 / 4", "set_custom_exc"]),
    "edited_tests": (lambda r: set_test_source(set_test_source(build(r, WRONG01, EX02_LITERAL),
                                                               "test_ex01_tensor_bytes", "pass"),
                                               "test_ex02_units", "pass"), 1, ["1 / 4"]),
    "deleted_tests": (lambda r: delete_cell(delete_cell(build(r), "test_ex01_tensor_bytes"),
                                            "test_ex02_units"),
                      4, ["4 / 4"]),
    "infinite_loop": (lambda r: build(r, EX01 + "\nwhile True:\n    pass"), 4, ["timed out"]),
    "os_exit": (lambda r: build(r, ex02="import os\nos._exit(3)"), 2, ["2 / 4", "kernel"]),
    "sys_exit": (lambda r: build(r, ex02=EX02 + "\nimport sys\nsys.exit(1)"), 4, ["4 / 4"]),
    # numpy.empty reserves without touching: the address-space limit stops it at once
    "memory_bomb": (lambda r: build(r, ex02="import numpy\nblocks = []\nwhile True:\n"
                                    "    blocks.append(numpy.empty(2**27))"), 3,
                    ["3 / 4", "out of memory", "MemoryError"]),
    "fork_bomb": (lambda r: build(r, EX01 + "\nimport os, time\nwhile True:\n    if os.fork() == 0:\n"
                                  "        time.sleep(600)"), 4, ["4 / 4", "process limit"]),
    "huge_print": (lambda r: build(r, EX01 + "\nprint('x' * 100_000_000)"), 4, ["4 / 4", "output"]),
    "stderr_noise": (lambda r: build(r, "import sys, warnings\n" + EX01.replace(
        "    return n * bytes_per_element",
        "    warnings.warn('deprecated')\n    print('noise', file=sys.stderr)\n"
        "    return n * bytes_per_element") + "\nsys.stderr.write('noise\\n' * 1000)"), 4, ["4 / 4"]),
    "snoop": (lambda r: build(r, ex02=EX02 + "\nimport os, socket\n"
                              "targets = TARGETS_PLACEHOLDER\n"
                              "for t in targets:\n    try:\n        open(t, 'a').write('pwned')\n"
                              "        print('WROTE', t)\n"
                              "    except Exception as e:\n        print('blocked', t, type(e).__name__)\n"
                              "    try:\n        open(t).read(10)\n        print('READ', t)\n"
                              "    except Exception as e:\n"
                              "        print('blocked read', t, type(e).__name__)\n"
                              "try:\n    s = socket.socket(socket.AF_UNIX); "
                              "s.connect('/ctl/grader.sock'); print('SOCKET')\n"
                              "except Exception as e:\n    print('no grader socket', type(e).__name__)\n"
                              "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
                              "    print('NETWORK')\n"
                              "except Exception as e:\n    print('no network', type(e).__name__)"),
              4, ["4 / 4"]),
    # attacks of issue 11
    "input_transformer": (wrong(TRANSFORMER), 0, ["0 / 4", "input_transformers"]),
    "spec_patch": (wrong(SPEC_PATCH), 0, ["0 / 4", "spec_from_file_location"]),
    "hooks": (wrong(HOOKS), 0, ["0 / 4"]),
    "lying_tensor": (lambda r: build(r, LYING_TENSOR + "def tensor_bytes(shape, b):\n    return Tensor()\n"
                                     "mlp_weight_bytes = Tensor()",
                                     LYING_TENSOR + "mlp_weight_mib = Tensor()\n"
                                     "mlp_weight_mb = Tensor()"), 0, ["0 / 4", "not plain data"]),
    "meta_cell": (lambda r: add_cell(build(r, WRONG01, WRONG02), new_code_cell(
        "import builtins\n_real = builtins.__import__\nbuiltins.__import__ = lambda *a, **k: _real(*a, **k)",
        metadata={"nbgrader": {"grade": False, "solution": False, "locked": False,
                               "grade_id": "ex01_tensor_bytes", "schema_version": 3}}),
        "ex01_tensor_bytes"), 0, ["0 / 4", "__import__"]),
    "leak": (lambda r: build(r, LEAK + EX01, EX02 + "\n" + LEAK_SHOW), 4, ["4 / 4"]),
    "xss": (lambda r: add_cell(build(r, EX01 + "\n" + XSS), new_markdown_cell(XSS_MARKDOWN), "ex02_units"),
            4, ["4 / 4"]),
    "ansi_flood": (lambda r: build(r, EX01 + "\n" + ANSI_FLOOD), 4, ["4 / 4", "output"]),
    "fork_sleepers": (lambda r: build(r, EX01 + "\n" + FORK_SLEEPERS, EX02 + "\n" + COUNT_CHILDREN), 4,
                      ["4 / 4", "process limit"]),
    "cpu_hog": (lambda r: build(r, EX01 + "\n" + CPU_HOG), 4, ["4 / 4"]),
    "slow_function": (lambda r: build(r, "import time\ndef tensor_bytes(shape, b):\n    time.sleep(3600)\n"
                                      "mlp_weight_bytes = 117_440_512", EX02_LITERAL), 2,
                      ["2 / 4", "did not answer within"]),
    "huge_answer": (lambda r: build(r, ex02="mlp_weight_mib = [0.5] * 3_000_000\nmlp_weight_mb = 117.44"), 3,
                    ["3 / 4", "values"]),
    "answers_objects": (lambda r: build(r, "def tensor_bytes(shape, b):\n    return lambda: 0\n"
                                        "mlp_weight_bytes = object()"), 0, ["0 / 4", "not plain data"]),
}
ALL_STUDENTS = set(CASES) | {"damaged", "empty", "linker", "surrogate", "deep", "hardlink"}


def _has_decide():
    try:
        from longctx.lessons import policy_checks
    except Exception:  # noqa: BLE001
        return False
    return hasattr(policy_checks, "decide")


SCHED = _has_decide()


def sched_lesson(root):
    """Lesson 02's scheduler exercise and its test cell (hidden tests included), alone: cheap to grade."""
    src = h.solution(h.REPO, "02_chunked_prefill") if os.path.exists(
        os.path.join(h.REPO, "solutions", "02_chunked_prefill")) else None
    cells = [c for c in src.cells if c.metadata.get("nbgrader", {}).get("grade_id") in
             ("ex21_scheduler", "test_ex21_scheduler")]
    for cell in cells:  # the exercise written against the library's current Scheduler API
        if cell.metadata["nbgrader"]["grade_id"] == "ex21_scheduler":
            cell.source = "### BEGIN SOLUTION\n" + SCHED_HONEST + "### END SOLUTION"
        else:  # the lesson's visible tests and one hidden workload (all of them take ~3,000 round trips)
            visible = cell.source.split("### BEGIN HIDDEN TESTS")[0]
            cell.source = visible + ("### BEGIN HIDDEN TESTS\n"
                                     "from longctx.lessons.policy_checks import random_workload\n"
                                     "check_stall_free(StallFreeScheduler(token_budget=32), "
                                     "random_workload(12, 0))\n"
                                     "### END HIDDEN TESTS")
    imports = new_code_cell("from longctx.engine import ScheduledBatch, Scheduler",
                            metadata=h._meta("sched_imports", locked=True))
    nb = nbformat.v4.new_notebook(cells=[imports] + cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    os.makedirs(os.path.join(root, "solutions", "sched"))
    nbformat.write(nb, os.path.join(root, "solutions", "sched", "sched.ipynb"))
    h.release(root, "sched")


SCHED_HONEST = ("class StallFreeScheduler(Scheduler):\n    def __init__(self, token_budget):\n"
                "        self.token_budget = token_budget\n\n"
               "    def schedule(self, running, waiting, batch):\n"
                "        for seq in running:\n            if seq.is_decode and batch.budget_left:\n"
                "                batch.add(seq, 1)\n        for seq in running:\n"
                "            if not seq.is_decode and batch.budget_left:\n"
                "                batch.add(seq, min(seq.num_uncomputed_tokens, batch.budget_left))\n"
                "        for seq in waiting:\n            if not batch.budget_left or not batch.add(\n"
                "                    seq, min(seq.num_uncomputed_tokens, batch.budget_left)):\n"
                "                break\n")
SCHED_ZERO = ("import longctx.lessons.policy_checks as pc, longctx.lessons.policy_state as ps\n"
              "for m in (pc, ps):\n"
              "    for name in dir(m):\n"
              "        if name.startswith('check') or name in ('decide', 'run_policy'):\n"
              "            setattr(m, name, lambda *a, **k: None)\n"
              "class StallFreeScheduler(Scheduler):\n    def __init__(self, token_budget):\n"
              "        self.token_budget = token_budget\n    def schedule(self, *args, **kwargs):\n"
              "        return None\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    # An interrupted earlier run may have left its 1,100-level folder behind, which pytest's own clean-up of
    # old temporary folders cannot remove (it recurses once per level): remove those first.
    for leftover in tmp_path_factory.getbasetemp().parent.glob("*/hostile*/course/autograder/submitted/deep"):
        _remove_deep(str(leftover))
    root = h.make_course(tmp_path_factory.mktemp("hostile"), lessons=[L00], use_real_lessons=True)
    ag = os.path.join(root, "autograder")
    targets = [os.path.join(ag, "gradebook.db"), os.path.join(ag, "grades.csv"),
               os.path.join(ag, "submitted", "honest", L00, f"{L00}.ipynb"),
               os.path.join(ag, "submitted", "honest", L00, "secret.txt"),
               os.path.join(root, "solutions", L00, f"{L00}.ipynb"),
               os.path.join(root, "longctx", "grading.py"),
               os.path.join(ag, "grade.py"), "/etc/hostname", "/root/.bashrc", "/ctl/input.ipynb"]
    released = h.released(root, L00)
    for student, (make, _, _) in CASES.items():
        nb = make(copy.deepcopy(released))
        if student == "snoop":
            h.answer(nb, "ex02_units", nb.cells[13].source.replace("TARGETS_PLACEHOLDER", repr(targets)))
        h.submit(root, student, L00, nb)
    h.submit(root, "honest", L00, extra_files={"secret.txt": "honest's notes"})
    folder = h.submit(root, "damaged", L00)
    with open(os.path.join(folder, f"{L00}.ipynb"), "w") as fh:
        fh.write("{ this is not json")
    h.submit(root, "empty", L00, extra_files={"notes.txt": "forgot the notebook"})
    linked = h.submit(root, "linker", L00, build(released))
    os.symlink(os.path.join(ag, "gradebook.db"), os.path.join(linked, "gradebook.db"))
    hard = h.submit(root, "hardlink", L00, build(released))
    os.link(os.path.join(root, "solutions", L00, f"{L00}.ipynb"), os.path.join(hard, "answers.ipynb"))
    folder = h.submit(root, "surrogate", L00)
    text = nbformat.writes(build(released)).replace('"nbformat": 4', '"nbformat": "\\udcff"')
    with open(os.path.join(folder, f"{L00}.ipynb"), "w") as fh:
        fh.write(text.replace('"# 00', '"\\ud800 # 00', 1))
    deep = h.submit(root, "deep", L00, build(released))
    cwd = os.getcwd()
    os.chdir(deep)
    try:
        for _ in range(1_100):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(cwd)
    if SCHED:
        sched_lesson(root)
        sol = h.solution(root, "sched")
        h.submit(root, "honest", "sched", sol)
        h.submit(root, "sched_zero", "sched",
                 h.answer(h.released(root, "sched"), "ex21_scheduler", SCHED_ZERO))
    protected = [os.path.join(root, d) for d in ("solutions", "lessons", "longctx")] + \
        [os.path.join(ag, f) for f in h.GRADER_FILES]
    before = h.snapshot(protected)
    result = h.grade(root, "--jobs", "2", "--cell-timeout-s", "20", "--call-timeout-s", "3",
                     "--wall-s", "300", "--memory-gib", "2", "--max-processes", "128",
                     "--timings", os.path.join(str(root), "t.json"),
                     timeout=1500)
    grades, rows = h.read_grades(root)
    yield root, result, grades, rows, before, protected
    _remove_deep(deep)


def _remove_deep(path):
    """shutil.rmtree recurses once per level; 1,100 levels need an iterative removal."""
    depth = 0
    while os.path.isdir(path + "/d" * (depth + 1)):
        depth += 1
    for level in range(depth, 0, -1):
        os.rmdir(path + "/d" * level)


def test_grader_finishes_and_writes_every_report(graded):
    root, result, *_ = graded
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for student in ALL_STUDENTS:
        assert os.path.exists(os.path.join(root, "autograder", "reports", f"{student}.txt")), student


@pytest.mark.parametrize("student", sorted(CASES))
def test_each_submission_earns_exactly_its_points(graded, student):
    root, result, grades, *_ = graded
    expected = CASES[student][1]
    assert grades[(student, L00)] == expected, h.report(root, student) + result.stdout[-2000:]
    text = h.report(root, student)
    for word in CASES[student][2]:
        assert word in text, (word, text)


def test_every_submission_is_in_grades_csv(graded):
    root, _, grades, rows, *_ = graded
    assert ALL_STUDENTS <= {s for s, _ in grades}
    for student in ("damaged", "empty", "surrogate"):
        assert grades[(student, L00)] == 0, h.report(root, student)
    for student in ("linker", "deep", "hardlink"):
        assert grades[(student, L00)] == 4, h.report(root, student)


def test_bad_folders_are_explained(graded):
    root = graded[0]
    assert "graded as the blank lesson" in h.report(root, "damaged")
    assert "graded as the blank lesson" in h.report(root, "surrogate")
    # only the notebook is staged (issue 44): the link, the hard link and the deep tree are never even opened
    assert "ignored 'gradebook.db': only the notebook" in h.report(root, "linker")
    assert "ignored 'answers.ipynb': only the notebook" in h.report(root, "hardlink")
    assert "ignored 'd': only the notebook" in h.report(root, "deep")


def test_no_other_file_changed(graded):
    root, _, _, _, before, protected = graded
    assert h.snapshot(protected) == before


def _outputs(root, student, lesson=L00):
    nb = nbformat.read(os.path.join(root, "autograder", "autograded", student, lesson, f"{lesson}.ipynb"),
                       as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_sandbox_blocked_reads_writes_socket_and_network(graded):
    root = graded[0]
    text = _outputs(root, "snoop")
    assert "WROTE" not in text and "NETWORK" not in text and "SOCKET" not in text, text
    allowed = ("READ /etc/hostname", f"READ {os.path.join(root, 'longctx', 'grading.py')}")  # system, library
    for line in text.splitlines():
        assert not line.startswith("READ") or line in allowed, text
    assert "no network" in text and "no grader socket" in text


def _student_visible(root, student, lesson=L00):
    texts = [h.report(root, student)]
    path = os.path.join(root, "autograder", "feedback", student, lesson, f"{lesson}.html")
    if os.path.exists(path):
        texts.append(open(path, encoding="utf-8").read())
    return "\n".join(texts)


def test_hidden_test_source_reaches_no_student_visible_output(graded):
    root, result, grades, *_ = graded
    for student in sorted(ALL_STUDENTS):
        visible = _student_visible(root, student) + result.stdout
        for piece in HIDDEN_SOURCE:
            assert piece not in visible, (student, piece)
    leak = _outputs(root, "leak")
    assert "LEAK-DUMP" in leak and "blocked /ctl" in leak, leak[:3000]
    for piece in HIDDEN_SOURCE + ["test_ex01_tensor_bytes", "check_number(\"mlp_weight_mib\""]:
        assert piece not in leak, piece  # not even the visible tests ran in the kernel


def test_feedback_html_runs_no_student_script(graded):
    root = graded[0]
    html = open(os.path.join(root, "autograder", "feedback", "xss", L00, f"{L00}.html"),
                encoding="utf-8").read()
    for n in range(1, 10):
        for pattern in (rf"<script[^>]*>[^<]*S{n}", rf"<img[^>]*onerror[^>]*S{n}",
                        rf"<a\s[^>]*href=\"?javascript:[^\"]*S{n}",
                        rf"<iframe[^>]*S{n}"):
            assert not re.search(pattern, html, re.S), (pattern, n)
    # such outputs are dropped (text/plain stays)
    for kind in ("output_javascript", "output_svg", "output_html"):
        assert kind not in html, kind


def test_output_floods_are_capped_and_feedback_is_quick(graded):
    root = graded[0]
    for student in ("huge_print", "ansi_flood"):
        path = os.path.join(root, "autograder", "autograded", student, L00, f"{L00}.ipynb")
        assert os.path.getsize(path) < 2_000_000, student
        assert os.path.getsize(
            os.path.join(root, "autograder", "feedback", student, L00, f"{L00}.html")) < 3_000_000
    timings = json.load(open(os.path.join(str(root), "t.json")))
    feedback = {r["student"]: r.get("feedback_s", 0.0) for r in timings["submissions"] if r["lesson"] == L00}
    assert feedback["ansi_flood"] < 30, feedback


def test_left_behind_processes_are_stopped_after_the_cell(graded):
    root = graded[0]
    assert "CHILDREN 0" in _outputs(root, "fork_sleepers")


def test_cpu_is_limited_per_submission(graded):
    root = graded[0]
    text = _outputs(root, "cpu_hog")
    ratio = float(re.search(r"CPU_RATIO ([0-9.]+)", text).group(1))
    share = max(1, (os.cpu_count() or 1) // 2)  # the cores of one of --jobs 2
    assert ratio < share + 0.4, text  # 4 busy processes get about their share of the cores, not more
    assert "RLIMIT_CPU (-1" not in text and "RLIMIT_CPU" in text


@pytest.mark.skipif(not SCHED, reason="longctx.lessons.policy_state.decide (lesson 02's plain-data protocol) "
                                      "is not in the library yet")
def test_scheduler_lesson_honest_full_and_patched_library_zero(graded):
    root, result, grades, *_ = graded
    assert grades[("honest", "sched")] == 4, h.report(root, "honest") + result.stdout[-2000:]
    assert grades[("sched_zero", "sched")] == 0, h.report(root, "sched_zero")


def test_progress_lines_and_summary(graded):
    _, result, *_ = graded
    n = len(ALL_STUDENTS) + (2 if SCHED else 0)
    assert result.stdout.count("executed ") == n
    assert f"{n} submission(s) graded" in result.stdout


def test_uids_are_unique_across_concurrent_runs():
    """A second grading run (another process) never gets a uid the first run holds."""
    code = (f"import sys; sys.path.insert(0, {os.path.join(h.REPO, 'autograder')!r}); import sandbox; "
            "a = sandbox.UidLease(); b = sandbox.UidLease(); print(a.uid, b.uid, flush=True); "
            "sys.stdin.read()")
    first = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        held = set(map(int, first.stdout.readline().split()))
        mine = sandbox.UidLease()
        try:
            assert len(held) == 2 and mine.uid not in held
        finally:
            mine.release()
    finally:
        first.stdin.close()
        first.wait(timeout=30)
