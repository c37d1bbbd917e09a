"""Autograde every submission under autograder/submitted/<student>/<lesson>/ safely and fairly.

    python autograder/grade.py [--jobs N] [--lesson ID ...] [--student ID ...]      (what `make grade` runs)

The guarantee (autograder/README.md): the checks, their expected values and the hidden tests never run
in, and are never sent to, a process that ran student code. Steps:
1. Register the lessons: `generate_assignment` into a private release folder (autograder/.work/release),
   which creates autograder/gradebook.db on a fresh clone and never touches lessons/. Start the checker
   fork server (autograder/checker.py, the instructor's library preloaded) before reading any submission.
2. Stage each submission: copy its regular files (no links, no hard links, bounded depth, count and size)
   to autograder/.work/staged. A notebook that cannot be read is replaced by the blank released lesson.
3. Sanitize with nbgrader's own preprocessors (test cells restored, deleted ones added back), then blank
   every test cell: the sandbox gets the student's cells only.
4. Execute every submission in its own sandbox (autograder/sandbox.py), N at a time. At each test cell
   the sandbox's executor asks this process to check it: a fresh checker child runs the instructor's test
   source from solutions/ and gets only plain data from the student's kernel (values, results of calling
   the student's functions, a scheduler's decisions), relayed by this process. Its verdict is the test's.
5. As each submission finishes, a bookkeeping worker (autograder/bookkeeper.py; nbgrader's `autograde`
   with the verdicts as the test cells' outputs, then `generate_feedback`, each with a time limit)
   records it; finally grades.csv (`nbgrader export`'s columns), a report per student under
   autograder/reports/, and a summary table. Every per-submission step is contained: a submission that
   breaks one is graded 0 with the reason, and the others are graded as usual.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import queue
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402
import sandbox  # noqa: E402

MAX_NOTEBOOK_BYTES = 20 * 2**20
MAX_SUBMISSION_BYTES = 100 * 2**20
MAX_DEPTH = 12
MAX_ENTRIES = 2_000
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
SAFE_NAME = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,200}$")
SUSPICIOUS = ["set_custom_exc", "run_cell", "sys.modules", "builtins", "__builtins__", "__import__", "ctypes",
              "os._exit", "settrace", "setprofile", "gc.get_referrers", "inspect.currentframe", "sys._getframe",
              "TorchFunctionMode", "__torch_function__", "__class__ =", "exec(", "eval(", "longctx.grading",
              "input_transformers", "events.register", "showtraceback", "spec_from_file_location"]
FEEDBACK_TIMEOUT_S = 60.0
AUTOGRADE_TIMEOUT_S = 120.0
MAX_LINE_BYTES = 40 * 2**20


@dataclass
class Job:
    student: str
    lesson: str
    staged_dir: str = ""
    ctl_dir: str = ""
    test_plans: dict = field(default_factory=dict)     # cell index -> checker spec
    verdicts: dict = field(default_factory=dict)       # cell index -> checker verdict
    notes: list = field(default_factory=list)
    flags: list = field(default_factory=list)
    result: sandbox.RunResult | None = None
    score: float = 0.0
    max_score: float = 0.0
    tests: list = field(default_factory=list)          # (name, score, max, message)
    error: str = ""
    timings: dict = field(default_factory=dict)


def clean(text) -> str:
    """Text safe to print and to write as UTF-8 (lone surrogates and control characters replaced)."""
    text = str(text).encode("utf-8", "replace").decode("utf-8")
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "?", text)


# ----------------------------------------------------------------------------- discovery and staging
def discover(root, lessons_filter, students_filter, solutions):
    base = os.path.join(root, "autograder", "submitted")
    found, skipped = [], []
    if not os.path.isdir(base):
        return found, skipped
    for student in sorted(os.listdir(base)):
        sdir = os.path.join(base, student)
        if not os.path.isdir(sdir) or os.path.islink(sdir) or (students_filter and student not in students_filter):
            continue
        if not ID_RE.match(student):
            skipped.append((clean(ascii(student)), "*", "student folder name has unusual characters"))
            continue
        try:
            lessons = sorted(os.listdir(sdir))
        except OSError as exc:
            skipped.append((student, "*", f"cannot list the folder ({exc.strerror})"))
            continue
        for lesson in lessons:
            ldir = os.path.join(sdir, lesson)
            if not os.path.isdir(ldir) or os.path.islink(ldir) or (lessons_filter and lesson not in lessons_filter):
                continue
            if lesson not in solutions:
                skipped.append((student, clean(ascii(lesson))[:60], "no such lesson in solutions/"))
                continue
            found.append((student, lesson))
    return found, skipped


def stage(root, work, student, lesson):
    """Copy regular files only into the staging area; returns (folder, notes).

    Iterative and bounded (depth, number of entries, bytes): links, hard links, devices, odd names and
    deep or huge trees are skipped with a note, never followed.
    """
    src = os.path.join(root, "autograder", "submitted", student, lesson)
    dst = os.path.join(work, "staged", student, lesson)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    notes, total, seen = [], 0, 0
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        try:
            with os.scandir(os.path.join(src, rel)) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            notes.append(f"could not read folder {clean(ascii(rel))}: {exc.strerror}")
            continue
        for entry in entries:
            seen += 1
            name_rel = os.path.join(rel, entry.name)
            shown = clean(ascii(name_rel))[:200]
            if seen > MAX_ENTRIES:
                notes.append(f"ignored everything after {MAX_ENTRIES} files and folders")
                return dst, notes
            if not SAFE_NAME.match(entry.name) or entry.name.startswith(".") or \
                    entry.name.encode("utf-8", "surrogateescape") != entry.name.encode("utf-8", "replace"):
                notes.append(f"ignored {shown}: hidden or unusual file name")
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 >= MAX_DEPTH:
                    notes.append(f"ignored {shown}: folders nested deeper than {MAX_DEPTH} levels")
                    continue
                os.makedirs(os.path.join(dst, name_rel), exist_ok=True)
                stack.append((name_rel, depth + 1))
                continue
            if not stat.S_ISREG(st.st_mode):
                notes.append(f"ignored {shown}: not a regular file (links are not followed)")
                continue
            if st.st_nlink > 1:
                notes.append(f"ignored {shown}: a hard link (it may point at a file outside the submission)")
                continue
            total += st.st_size
            if st.st_size > MAX_NOTEBOOK_BYTES or total > MAX_SUBMISSION_BYTES:
                notes.append(f"ignored {shown}: too large ({st.st_size} bytes)")
                continue
            fd = os.open(os.path.join(src, name_rel), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fin, open(os.path.join(dst, name_rel), "wb") as fout:
                shutil.copyfileobj(fin, fout, 1 << 20)
    return dst, notes


def _clean_strings(obj):
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, list):
        return [_clean_strings(x) for x in obj]
    if isinstance(obj, dict):
        return {_clean_strings(k): _clean_strings(v) for k, v in obj.items()}
    return obj


def read_notebook(path):
    """nbformat node of a submitted notebook: bounded size, lone surrogates replaced, validated."""
    import nbformat

    if os.path.getsize(path) > MAX_NOTEBOOK_BYTES:
        raise ValueError("the notebook is larger than 20 MiB")
    with open(path, "rb") as fh:
        raw = fh.read(MAX_NOTEBOOK_BYTES + 1).decode("utf-8", "replace")
    data = _clean_strings(json.loads(raw))
    nb = nbformat.reads(json.dumps(data), as_version=4)
    nbformat.validate(nb)
    return nb


# ----------------------------------------------------------------------------- preparation
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


# ----------------------------------------------------------------------------- checking (the grader's side)
class CheckService:
    """Listens on ctl_dir/grader.sock for one sandbox; runs a checker child for each test cell it announces."""

    def __init__(self, job, mp_context, limits):
        self.job, self.ctx, self.limits = job, mp_context, limits
        self.path = os.path.join(job.ctl_dir, "grader.sock")
        if os.path.exists(self.path):
            os.remove(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dir_fd = os.open(job.ctl_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:  # a Unix socket path must be < 108 bytes: bind through the folder's descriptor instead
            self.listener.bind(f"/proc/self/fd/{dir_fd}/grader.sock")
        finally:
            os.close(dir_fd)
        os.chmod(self.path, 0o600)
        self.listener.listen(1)
        self.listener.settimeout(0.5)
        self.stop = threading.Event()
        self.check_s = 0.0
        self.check_cpu_s = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=self.limits.call_timeout_s + 60)
        self.listener.close()

    def _run(self):
        conn = None
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
                break
            except TimeoutError:
                continue
            except OSError:
                return
        if conn is None:
            return
        conn.settimeout(None)
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline(MAX_LINE_BYTES)
                if not line or not line.endswith(b"\n"):
                    return
                msg = json.loads(line)
                if msg.get("op") == "test" and int(msg.get("cell", -1)) in self.job.test_plans:
                    index = int(msg["cell"])
                    start = time.monotonic()
                    self.job.verdicts[index] = self._check(index, conn, reader)
                    self.check_s += time.monotonic() - start
                    self.check_cpu_s += float(self.job.verdicts[index].get("cpu_s", 0.0))
                    conn.sendall(b'{"op": "done"}\n')
                else:
                    return
        except (OSError, ValueError) as exc:
            if not self.stop.is_set():
                self.job.notes.append(f"the link to the sandbox broke ({type(exc).__name__})")
        finally:
            reader.close()
            conn.close()

    def _check(self, index, conn, reader):
        import checker as ck

        spec = self.job.test_plans[index]
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=ck.run_check, args=(child, spec), daemon=True)
        proc.start()
        child.close()
        deadline = time.monotonic() + self.limits.test_timeout_s
        verdict = None
        try:
            while verdict is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not parent.poll(remaining):
                    verdict = _failed("TestTimeout", f"the test took longer than {self.limits.test_timeout_s:g} s "
                                                     "(the student's functions are slow or never return)")
                    break
                try:
                    kind, payload = parent.recv()
                except (EOFError, OSError):
                    verdict = _failed("GraderError", "the checker process stopped unexpectedly", infra=True)
                    break
                if kind == "verdict":
                    verdict = payload
                elif kind == "kernel":
                    conn.sendall((json.dumps({"op": "kernel", "text": payload}) + "\n").encode())
                    conn.settimeout(self.limits.call_timeout_s + 30)
                    line = reader.readline(MAX_LINE_BYTES)
                    conn.settimeout(None)
                    if not line.endswith(b"\n"):
                        raise OSError("no answer from the sandbox")
                    text = json.loads(line).get("text")
                    parent.send(text if isinstance(text, str) else "!the sandbox sent no answer")
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()
        if verdict.get("infra"):
            self.job.notes.append(f"grading problem in {spec.get('grade_id')}: {verdict.get('evalue', '')[:300]}")
        return verdict


def _failed(ename, evalue, infra=False):
    return {"passed": False, "ename": ename, "evalue": evalue, "stdout": "", "infra": infra}


def start_checker_server(root):
    """The fork server every checker child comes from; started before any submission is read."""
    import multiprocessing
    from multiprocessing import forkserver

    if root not in sys.path:
        sys.path.insert(0, root)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(checker.PRELOAD)
    forkserver.ensure_running()
    return ctx


# ----------------------------------------------------------------------------- bookkeeping worker
class Bookkeeper:
    """nbgrader's autograde / feedback / export in a worker process, each task with a time limit."""

    def __init__(self, root, work):
        self.root, self.work, self.proc = root, work, None
        self._replies = queue.Queue()
        self._lock = threading.Lock()

    def _start(self):
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "bookkeeper.py"), self.root, self.work],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True, encoding="utf-8", errors="replace")
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._replies), daemon=True).start()
        ready = self._get(120)
        if not ready or not ready.get("ready"):
            raise RuntimeError("the bookkeeping worker did not start")

    @staticmethod
    def _read(proc, replies):
        for line in proc.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(None)

    def _get(self, timeout):
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def ask(self, task, timeout):
        """The worker's answer, or {"ok": False, "error": ...} after `timeout` s (the worker is then restarted)."""
        with self._lock:
            return self._ask(task, timeout)

    def _ask(self, task, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(task, ensure_ascii=True) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return {"ok": False, "error": "the bookkeeping worker stopped"}
        reply = self._get(timeout)
        if reply is None:
            self.close()
            return {"ok": False, "error": f"took longer than {timeout:g} s (stopped)"}
        return reply

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait(timeout=30)
            self.proc = None


def record(job, keeper, no_feedback):
    """Autograde, then feedback, for one executed submission; any failure stays this submission's."""
    t0 = time.monotonic()
    reply = keeper.ask({"op": "autograde", "student": job.student, "lesson": job.lesson, "ctl_dir": job.ctl_dir,
                        "stop_reason": stop_reason(job)}, AUTOGRADE_TIMEOUT_S)
    job.notes += [clean(n) for n in reply.get("notes", [])]
    if not reply.get("ok") or reply.get("error"):
        job.error = clean(reply.get("error") or "autograde failed")[-1500:]
        keeper.ask({"op": "add_student", "student": job.student}, 60)
    else:
        job.score, job.max_score = float(reply["score"]), float(reply["max_score"])
        job.tests = [(clean(n), float(s), float(m), clean(msg)) for n, s, m, msg in reply["tests"]]
    job.timings["autograde_s"] = time.monotonic() - t0
    job.timings["autograde_cpu_s"] = float(reply.get("cpu_s", 0.0))
    if not no_feedback and not job.error:
        t0 = time.monotonic()
        fb = keeper.ask({"op": "feedback", "student": job.student, "lesson": job.lesson}, FEEDBACK_TIMEOUT_S)
        if not fb.get("ok"):
            job.notes.append("feedback could not be generated: " + clean(fb.get("error") or "")[-300:])
            stale = os.path.join(keeper.root, "autograder", "feedback", job.student, job.lesson)
            shutil.rmtree(stale, ignore_errors=True)
        job.timings["feedback_s"] = time.monotonic() - t0
        job.timings["feedback_cpu_s"] = float(fb.get("cpu_s", 0.0))


def stop_reason(job):
    r = job.result
    if r is None:
        return "not run: the notebook was not executed" + (f" ({job.error})" if job.error else "")
    if r.state == "timeout":
        return f"not run: {r.detail}"
    if r.state == "kernel_died":
        return f"not run: {r.detail} in an earlier cell"
    if r.state in ("error", "sandbox_failed"):
        return f"not run: the grader could not execute the notebook ({clean(r.detail)[:300]})"
    return "this test was not checked (the notebook stopped before it)"


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", "-j", type=int, default=int(os.environ.get("JOBS") or os.cpu_count() or 1),
                   help="submissions graded in parallel (default: $JOBS or the number of cores)")
    p.add_argument("--lesson", action="append", default=[], help="grade only this lesson (repeatable)")
    p.add_argument("--student", action="append", default=[], help="grade only this student (repeatable)")
    p.add_argument("--course-root", default=os.path.dirname(HERE), help=argparse.SUPPRESS)
    p.add_argument("--wall-s", type=float, default=600.0, help="time limit per notebook (s)")
    p.add_argument("--cell-timeout-s", type=float, default=120.0, help="time limit per cell of the notebook (s)")
    p.add_argument("--test-timeout-s", type=float, default=300.0,
                   help="time limit per test cell, all its calls of the student's code included (s)")
    p.add_argument("--call-timeout-s", type=float, default=20.0,
                   help="time limit of one call of the student's code made by a test (s)")
    p.add_argument("--memory-gib", type=float, default=4.0, help="memory limit per notebook (GiB)")
    p.add_argument("--max-processes", type=int, default=256, help="processes+threads per notebook")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--timings", default="", help=argparse.SUPPRESS)  # JSON file of per-phase timings
    return p.parse_args(argv)


def log(msg):
    print(clean(msg), flush=True)


def main(argv=None):
    args = parse_args(argv)
    root = os.path.abspath(args.course_root)
    venv_bin = os.path.dirname(sys.executable)
    os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")  # nbgrader runs `alembic`
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    problems = sandbox.check()
    if problems:
        log("make grade: cannot grade safely on this machine:")
        for problem in problems:
            log(f"  - {problem}")
        log("Run `autograder/check_sandbox.sh` for details (see the README's instructor guide).")
        return 2

    import warnings

    warnings.filterwarnings("ignore")
    import bookkeeper

    t_start = time.monotonic()
    work = os.path.join(root, "autograder", ".work")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o700)
    config = bookkeeper.load_config(root, work)
    api = bookkeeper.make_api(config)
    sol_dir = os.path.join(root, "solutions")
    solutions = sorted(d for d in os.listdir(sol_dir)
                       if os.path.isfile(os.path.join(sol_dir, d, f"{d}.ipynb"))) if os.path.isdir(sol_dir) else []
    pairs, skipped = discover(root, set(args.lesson), set(args.student), set(solutions))
    for student, lesson, why in skipped:
        log(f"skipped {student}/{lesson}: {why}")
    if not pairs:
        log("no submissions found under autograder/submitted/<student>/<lesson>/")
        return 0

    ctx = start_checker_server(root)
    lesson_info = {}
    for lesson in sorted({lesson for _, lesson in pairs}):
        result = api.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            log(f"could not register lesson {lesson}:\n{result.get('error') or result.get('log')}")
            return 1
        lesson_info[lesson] = solution_cells(root, lesson)
    keeper = Bookkeeper(root, work)
    threading.Thread(target=lambda: keeper.ask({"op": "noop"}, 120), daemon=True).start()  # starts it now

    limits = sandbox.Limits(wall_s=args.wall_s, cell_timeout_s=args.cell_timeout_s,
                            memory_bytes=int(args.memory_gib * 2**30), max_processes=args.max_processes,
                            threads=max(1, (os.cpu_count() or 1) // max(1, args.jobs)),
                            call_timeout_s=args.call_timeout_s, test_timeout_s=args.test_timeout_s)
    jobs = [Job(student, lesson, ctl_dir=os.path.join(work, "jobs", student, lesson, "ctl")) for student, lesson in pairs]
    uids = queue.Queue()
    leases = [sandbox.UidLease() for _ in range(max(1, args.jobs))]
    for lease in leases:
        uids.put(lease.uid)
    recorded = queue.Queue()
    done_count = [0]
    lock = threading.Lock()

    def execute(job):
        t0, cpu0 = time.monotonic(), time.thread_time()
        try:
            shutil.rmtree(os.path.dirname(job.ctl_dir), ignore_errors=True)
            job.staged_dir, notes = stage(root, work, job.student, job.lesson)
            job.notes += notes
            with lock:  # nbgrader's preprocessors share the gradebook
                test_cells = prepare(job, config, root, work, lesson_info[job.lesson])
            job.timings["prepare_s"] = time.monotonic() - t0
            job.timings["prepare_cpu_s"] = time.thread_time() - cpu0
            uid, service = uids.get(), None
            try:
                service = CheckService(job, ctx, limits)
                job.result = sandbox.run(course_root=root, ctl_dir=job.ctl_dir, submission_dir=job.staged_dir,
                                         uid=uid, limits=limits, test_cells=test_cells,
                                         extra_ro=extra_read_only_paths())
            finally:
                uids.put(uid)
                if service is not None:
                    service.close()
            job.timings["check_s"] = service.check_s
            job.timings["check_cpu_s"] = service.check_cpu_s
            with open(os.path.join(job.ctl_dir, "verdicts.json"), "w") as fh:
                json.dump({str(k): v for k, v in job.verdicts.items()}, fh)
        except Exception as exc:  # noqa: BLE001  (this submission only)
            job.error = f"{type(exc).__name__}: {clean(exc)[:300]}"
            job.notes.append("grading this submission failed: " + clean(traceback.format_exc(limit=3))[-600:])
        job.timings["execute_s"] = time.monotonic() - t0
        with lock:
            done_count[0] += 1
            r = job.result
            state = f"{r.state} in {r.elapsed_s:.1f} s{(' - ' + r.detail) if r.detail else ''}" if r else job.error
            log(f"[{done_count[0]:>3}/{len(jobs)}] executed {job.student}/{job.lesson}: {state}")
        recorded.put(job)

    def bookkeeping():
        for _ in jobs:
            job = recorded.get()
            try:
                record(job, keeper, args.no_feedback)
            except Exception as exc:  # noqa: BLE001
                job.error = job.error or f"{type(exc).__name__}: {clean(exc)[:300]}"

    keeping = threading.Thread(target=bookkeeping)
    keeping.start()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(execute, jobs))
    keeping.join()
    for lease in leases:
        lease.release()

    exported = keeper.ask({"op": "export", "dest": os.path.join(root, "autograder", "grades.csv")}, 300)
    keeper.close()
    if not exported.get("ok"):
        log("could not write grades.csv: " + clean(exported.get("error", "")))
    write_reports(root, jobs, skipped)
    elapsed = time.monotonic() - t_start
    print_summary(jobs, elapsed)
    if args.timings:
        write_timings(args.timings, jobs, elapsed, args.jobs)
    return 0 if exported.get("ok") else 1


def extra_read_only_paths():
    """Extra folders the lessons may read ($LONGCTX_GRADER_READONLY); the model cache is always mounted."""
    paths = [p for p in os.environ.get("LONGCTX_GRADER_READONLY", "").split(os.pathsep) if p]
    return [os.path.abspath(p) for p in paths if os.path.isdir(p)]


def write_timings(path, jobs, elapsed, n_jobs):
    rows = []
    for job in jobs:
        r = job.result
        status = {}
        if job.ctl_dir and os.path.exists(os.path.join(job.ctl_dir, "status.json")):
            status = sandbox._read_status(os.path.join(job.ctl_dir, "status.json"))
        keys = ("cells_s", "kernel_start_s", "kernel_start_cpu_s", "executor_cpu_s", "kernel_cpu_s", "answers_cpu_s")
        rows.append({"student": job.student, "lesson": job.lesson, "state": r.state if r else "not run",
                     "sandbox_s": r.elapsed_s if r else 0.0, **{k: status.get(k, 0.0) for k in keys}, **job.timings})
    with open(path, "w") as fh:
        json.dump({"elapsed_s": elapsed, "jobs": n_jobs, "submissions": rows}, fh, indent=1)


def _status_text(job):
    r = job.result
    if job.error:
        return "grading error"
    if r is None:
        return "not run"
    if r.state == "finished":
        extra = []
        if r.timeouts:
            extra.append(f"{len(r.timeouts)} cell(s) timed out")
        if r.truncated_cells:
            extra.append("output truncated")
        if r.process_limit_cells:
            extra.append("process limit hit")
        return "ok" + (f" ({', '.join(extra)})" if extra else "")
    if r.state == "kernel_died":
        return "out of memory" if "memory" in r.detail else "kernel died"
    return r.state.replace("_", " ")


def report_lines(job):
    r = job.result
    lines = [f"{job.lesson}: {job.score:g} / {job.max_score:g} points - {_status_text(job)}"]
    if r is not None:
        lines.append(f"  ran {r.elapsed_s:.1f} s; {r.detail}" if r.detail else f"  ran {r.elapsed_s:.1f} s")
        if r.timeouts:
            lines.append(f"  cells stopped by the per-cell time limit: {', '.join(map(str, r.timeouts))}")
        if r.truncated_cells:
            lines.append(f"  cells whose output was cut: {', '.join(map(str, r.truncated_cells))}")
        if r.process_limit_cells:
            lines.append("  process limit: cells " + ", ".join(map(str, r.process_limit_cells)) +
                         " left too many processes behind (a fork bomb?); they were stopped")
    oom = _looks_out_of_memory(job)
    if oom:
        lines.append(f"  out of memory: {oom}")
    for name, score, max_score, message in job.tests:
        mark = "passed" if score >= max_score else "FAILED"
        lines.append(f"  [{mark}] {name}: {score:g}/{max_score:g}" + (f" - {message}" if message and
                                                                     score < max_score else ""))
    for note in job.notes:
        lines.append(f"  note: {note}")
    if job.flags:
        lines.append("  review: the notebook's own code uses " + ", ".join(job.flags) +
                     " (the score does not depend on it: tests run outside the notebook's kernel)")
    if job.error:
        lines.append(f"  grading error: {job.error[-800:]}")
    return lines


def write_reports(root, jobs, skipped):
    folder = os.path.join(root, "autograder", "reports")
    os.makedirs(folder, exist_ok=True)
    by_student = {}
    for job in jobs:
        by_student.setdefault(job.student, []).append(job)
    for student, js in by_student.items():
        lines = [f"Grading report for {student}", "=" * (21 + len(student)), ""]
        for job in js:
            try:
                lines += report_lines(job)
            except Exception as exc:  # noqa: BLE001
                lines.append(f"{job.lesson}: {job.score:g} points (the report could not be written: {exc!r})")
            lines.append("")
        for s, lesson, why in skipped:
            if s == student:
                lines.append(f"{lesson}: skipped - {why}")
        with open(os.path.join(folder, f"{student}.txt"), "w", encoding="utf-8", errors="backslashreplace") as fh:
            fh.write(clean("\n".join(lines)) + "\n")


def _looks_out_of_memory(job):
    path = os.path.join(job.ctl_dir, "executed.ipynb")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(8 * MAX_NOTEBOOK_BYTES)
    except OSError:
        return ""
    for needle in ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc"):
        if needle in text:
            return f"a cell raised {needle} (limit per notebook)"
    return ""


def print_summary(jobs, elapsed):
    header = f"{'student':<20} {'lesson':<28} {'score':>11}  status"
    log("")
    log(header)
    log("-" * len(header))
    for job in sorted(jobs, key=lambda j: (j.lesson, j.student)):
        log(f"{job.student:<20} {job.lesson:<28} {job.score:>5g}/{job.max_score:<5g}  {_status_text(job)}"
            + (f"  [review: {', '.join(job.flags)}]" if job.flags else ""))
    log(f"\n{len(jobs)} submission(s) graded in {elapsed:.0f} s. grades.csv, feedback/ and reports/ are in "
        "autograder/.")


if __name__ == "__main__":
    sys.exit(main())
