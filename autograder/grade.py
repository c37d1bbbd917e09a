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
   breaks one is graded 0 with the reason, and the others are graded as usual. Written answers (nbgrader's
   manually graded cells) stay pending until graded in the formgrader (autograder/formgrade.sh): reports
   and summary say so, and the next run shows the final total.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import queue
import shutil
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

import sandbox  # noqa: E402
from bookkeeper_client import Bookkeeper  # noqa: E402
from checkservice import CheckService, start_checker_server  # noqa: E402
from preparation import prepare, solution_cells  # noqa: E402
from reports import log, print_summary, stop_reason, write_reports, write_timings  # noqa: E402
from staging import clean, discover, stage  # noqa: E402

FEEDBACK_TIMEOUT_S = 60.0
AUTOGRADE_TIMEOUT_S = 120.0


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
    tests: list = field(default_factory=list)          # (name, score, max, message); score None: pending
    pending: list = field(default_factory=list)        # (name, max): written answers awaiting manual grading
    hand_graded: list = field(default_factory=list)    # names with a manual score
    error: str = ""
    timings: dict = field(default_factory=dict)




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
        job.tests = [(clean(n), None if s is None else float(s), float(m), clean(msg))
                     for n, s, m, msg in reply["tests"]]
        job.pending = [(clean(n), float(m)) for n, m in reply.get("pending", [])]
        job.hand_graded = [clean(n) for n in reply.get("hand_graded", [])]
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
    p.add_argument("--python-warnings", default="ignore", choices=["ignore", "default"],
                   help="Python warnings in the student's kernel: hidden (default) or shown as stderr output")
    p.add_argument("--timings", default="", help=argparse.SUPPRESS)  # JSON file of per-phase timings
    return p.parse_args(argv)


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
    lesson_info = register_lessons(bookkeeper.make_api(config), root, sorted({lesson for _, lesson in pairs}))
    if lesson_info is None:
        return 1
    keeper = Bookkeeper(root, work)
    threading.Thread(target=lambda: keeper.ask({"op": "noop"}, 120), daemon=True).start()  # starts it now
    run = Run(root, work, config, ctx, limits_from(args), lesson_info)
    jobs = [Job(student, lesson, ctl_dir=os.path.join(work, "jobs", student, lesson, "ctl")) for student, lesson in pairs]
    run.grade_all(jobs, keeper, args.jobs, args.no_feedback)

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


def register_lessons(api, root, lessons):
    """nbgrader's generate_assignment for each lesson (creates the gradebook); the test cells from solutions/."""
    lesson_info = {}
    for lesson in lessons:
        result = api.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            log(f"could not register lesson {lesson}:\n{result.get('error') or result.get('log')}")
            return None
        lesson_info[lesson] = solution_cells(root, lesson)
    return lesson_info


def limits_from(args):
    return sandbox.Limits(wall_s=args.wall_s, cell_timeout_s=args.cell_timeout_s,
                          memory_bytes=int(args.memory_gib * 2**30), max_processes=args.max_processes,
                          threads=max(1, (os.cpu_count() or 1) // max(1, args.jobs)),
                          call_timeout_s=args.call_timeout_s, test_timeout_s=args.test_timeout_s,
                          python_warnings=args.python_warnings)


class Run:
    """One `make grade`: executes submissions N at a time while one thread records the finished ones."""

    def __init__(self, root, work, config, ctx, limits, lesson_info):
        self.root, self.work, self.config, self.ctx = root, work, config, ctx
        self.limits, self.lesson_info = limits, lesson_info
        self.lock = threading.Lock()
        self.uids = queue.Queue()
        self.finished = queue.Queue()
        self.done_count, self.total = 0, 0

    def grade_all(self, jobs, keeper, n_jobs, no_feedback):
        self.total = len(jobs)
        leases = [sandbox.UidLease() for _ in range(max(1, n_jobs))]
        for lease in leases:
            self.uids.put(lease.uid)
        keeping = threading.Thread(target=self.bookkeeping, args=(len(jobs), keeper, no_feedback))
        keeping.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
                list(pool.map(self.execute, jobs))
        finally:
            keeping.join()
            for lease in leases:
                lease.release()

    def execute(self, job):
        t0, cpu0 = time.monotonic(), time.thread_time()
        try:
            shutil.rmtree(os.path.dirname(job.ctl_dir), ignore_errors=True)
            job.staged_dir, notes = stage(self.root, self.work, job.student, job.lesson)
            job.notes += notes
            with self.lock:  # nbgrader's preprocessors share the gradebook
                test_cells = prepare(job, self.config, self.root, self.work, self.lesson_info[job.lesson])
            job.timings["prepare_s"] = time.monotonic() - t0
            job.timings["prepare_cpu_s"] = time.thread_time() - cpu0
            self._sandboxed(job, test_cells)
            with open(os.path.join(job.ctl_dir, "verdicts.json"), "w") as fh:
                json.dump({str(k): v for k, v in job.verdicts.items()}, fh)
        except Exception as exc:  # noqa: BLE001  (this submission only)
            job.error = f"{type(exc).__name__}: {clean(exc)[:300]}"
            job.notes.append("grading this submission failed: " + clean(traceback.format_exc(limit=3))[-600:])
        job.timings["execute_s"] = time.monotonic() - t0
        with self.lock:
            self.done_count += 1
            r = job.result
            state = f"{r.state} in {r.elapsed_s:.1f} s{(' - ' + r.detail) if r.detail else ''}" if r else job.error
            log(f"[{self.done_count:>3}/{self.total}] executed {job.student}/{job.lesson}: {state}")
        self.finished.put(job)

    def _sandboxed(self, job, test_cells):
        uid, service = self.uids.get(), None
        try:
            service = CheckService(job, self.ctx, self.limits)
            job.result = sandbox.run(course_root=self.root, ctl_dir=job.ctl_dir, submission_dir=job.staged_dir,
                                     uid=uid, limits=self.limits, test_cells=test_cells,
                                     extra_ro=extra_read_only_paths())
        finally:
            self.uids.put(uid)
            if service is not None:
                service.close()
        job.timings["check_s"] = service.check_s
        job.timings["check_cpu_s"] = service.check_cpu_s

    def bookkeeping(self, count, keeper, no_feedback):
        for _ in range(count):
            job = self.finished.get()
            try:
                record(job, keeper, no_feedback)
            except Exception as exc:  # noqa: BLE001
                job.error = job.error or f"{type(exc).__name__}: {clean(exc)[:300]}"


def extra_read_only_paths():
    """Extra folders the lessons may read ($LONGCTX_GRADER_READONLY); the model cache is always mounted."""
    paths = [p for p in os.environ.get("LONGCTX_GRADER_READONLY", "").split(os.pathsep) if p]
    return [os.path.abspath(p) for p in paths if os.path.isdir(p)]


if __name__ == "__main__":
    sys.exit(main())
