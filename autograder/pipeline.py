"""One `make grade` run's pipeline: N sandboxes at a time, then autograde and feedback in two workers.

Per submission (`Run.execute`, in one of N threads): stage its files, check its notebook in a limited
child process with a time limit (outside any lock), prepare it (nbgrader's preprocessors; the
grader-wide lock only around their two gradebook lookups, whose work is the lesson's), run it in its
sandbox with a checker service.
Then (`Run.autograding`, one thread) nbgrader's autograde in the bookkeeping worker, and (`Run.feedback`,
another thread) the feedback in a second worker, so a slow feedback never holds up the gradebook. After
its bookkeeping a submission's work folders (.work/jobs/..., .work/staged/...) are removed: what stays
is nbgrader's autograded notebook, the feedback, the gradebook and the report.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import queue
import shutil
import threading
import time
import traceback
from dataclasses import dataclass, field

import cgroups
import sandbox
import staging
from checkservice import CheckService
from preparation import prepare
from reports import log, looks_out_of_memory, stop_reason
from staging import clean, stage

FEEDBACK_TIMEOUT_S = 60.0
AUTOGRADE_TIMEOUT_S = 120.0
VALIDATE_TIMEOUT_S = 60.0
HELPER_MEMORY_BYTES = 2 * 2**30   # each checker child or notebook validator, beyond the preloaded library


@dataclass
class Job:
    student: str                                       # the student id (a safe alias for an odd folder name)
    lesson: str
    folder: str = ""                                   # the folder under autograder/submitted/
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
    oom_note: str = ""
    timings: dict = field(default_factory=dict)


def autograde(job, keeper):
    """nbgrader's autograde for one executed submission; any failure stays this submission's."""
    t0 = time.monotonic()
    reply = keeper.ask({"op": "autograde", "student": job.student, "lesson": job.lesson,
                        "ctl_dir": job.ctl_dir, "stop_reason": stop_reason(job)}, AUTOGRADE_TIMEOUT_S)
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


def feedback(job, keeper):
    t0 = time.monotonic()
    fb = keeper.ask({"op": "feedback", "student": job.student, "lesson": job.lesson}, FEEDBACK_TIMEOUT_S)
    if not fb.get("ok"):
        job.notes.append("feedback could not be generated: " + clean(fb.get("error") or "")[-300:])
        shutil.rmtree(os.path.join(keeper.root, "autograder", "feedback", job.student, job.lesson),
                      ignore_errors=True)
    job.timings["feedback_s"] = time.monotonic() - t0
    job.timings["feedback_cpu_s"] = float(fb.get("cpu_s", 0.0))


class Run:
    """One `make grade`: executes submissions N at a time while two threads record the finished ones."""

    def __init__(self, root, work, config, ctx, limits, lesson_info, cgroup_host=None, extra_ro=()):
        self.root, self.work, self.config, self.ctx = root, work, config, ctx
        self.limits, self.lesson_info, self.cgroup_host = limits, lesson_info, cgroup_host
        self.extra_ro = list(extra_ro)
        self.lock = threading.Lock()
        self.uids = queue.Queue()
        self.finished, self.to_feedback = queue.Queue(), queue.Queue()
        self.done_count, self.total = 0, 0
        self.checker_cgroup = None

    def grade_all(self, jobs, keeper, feedback_keeper, n_jobs, no_feedback):
        self.total, n_jobs = len(jobs), max(1, n_jobs)
        if self.cgroup_host is not None and self.cgroup_host.kind:
            self.checker_cgroup = cgroups.Cgroup(self.cgroup_host, "longctx-grader-checkers",
                                                 n_jobs * HELPER_MEMORY_BYTES, 32 + 16 * n_jobs,
                                                 max(1, (os.cpu_count() or 1) // 2))
        leases = [sandbox.UidLease() for _ in range(n_jobs)]
        for lease in leases:
            self.uids.put(lease.uid)
        threads = [threading.Thread(target=self.autograding, args=(len(jobs), keeper, no_feedback)),
                   threading.Thread(target=self.feedback, args=(feedback_keeper,))]
        for thread in threads:
            thread.start()
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=n_jobs) as pool:
                list(pool.map(self.execute, jobs))
        finally:
            for thread in threads:
                thread.join()
            self.remove_empty_student_folders()
            for lease in leases:
                lease.release()
            if self.checker_cgroup is not None:
                self.checker_cgroup.remove()

    def helper_limits(self, cpu_s):
        procs = self.checker_cgroup.procs_files() if self.checker_cgroup else []
        return {"cgroup_procs": procs, "cpu_s": int(cpu_s), "memory_bytes": HELPER_MEMORY_BYTES}

    def validate(self, job):
        """Why the staged notebook cannot be used ("" if it can), from a limited child with a time limit."""
        path = os.path.join(job.staged_dir, f"{job.lesson}.ipynb")
        if not os.path.exists(path):
            return f"no {job.lesson}.ipynb in the submission"
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=staging.validate_entry, daemon=True, args=(
            child, path, self.lesson_info[job.lesson].max_cells, self.helper_limits(VALIDATE_TIMEOUT_S),
            self.lesson_info[job.lesson].metadata))
        proc.start()
        child.close()
        try:
            if not parent.poll(VALIDATE_TIMEOUT_S):
                return f"checking the notebook took longer than {VALIDATE_TIMEOUT_S:g} s"
            reason, cpu_s = parent.recv()
            job.timings["validate_cpu_s"] = float(cpu_s)
            return str(reason)
        except (EOFError, OSError, ValueError, TypeError):
            return "the notebook's check stopped unexpectedly (too large or too complex)"
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
            parent.close()

    def execute(self, job):
        t0, cpu0 = time.monotonic(), time.thread_time()
        try:
            shutil.rmtree(os.path.dirname(job.ctl_dir), ignore_errors=True)
            job.staged_dir, notes = stage(self.root, self.work, job.folder or job.student, job.student,
                                          job.lesson)
            job.notes += notes
            t_check = time.monotonic()
            problem = self.validate(job)
            job.timings["validate_s"] = time.monotonic() - t_check
            # the lock (nbgrader's preprocessors share the gradebook) is held inside, around the lookups only
            test_cells = prepare(job, self.config, self.work, self.lesson_info[job.lesson], problem,
                                 self.lock)
            job.timings["prepare_s"] = time.monotonic() - t0
            job.timings["prepare_cpu_s"] = time.thread_time() - cpu0 + job.timings.get("validate_cpu_s", 0.0)
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
            state = (f"{r.state} in {r.elapsed_s:.1f} s{(' - ' + r.detail) if r.detail else ''}" if r
                     else job.error)
            log(f"[{self.done_count:>3}/{self.total}] executed {job.student}/{job.lesson}: {clean(state)}")
        self.finished.put(job)

    def _sandboxed(self, job, test_cells):
        uid, service = self.uids.get(), None
        try:
            service = CheckService(job, self.ctx, self.limits, self.checker_cgroup)
            job.result = sandbox.run(course_root=self.root, ctl_dir=job.ctl_dir,
                                     submission_dir=job.staged_dir, uid=uid, limits=self.limits,
                                     test_cells=test_cells, extra_ro=self.extra_ro,
                                     cgroup_host=self.cgroup_host)
        finally:
            self.uids.put(uid)
            if service is not None:
                service.close()
        job.timings["check_s"] = service.check_s
        job.timings["check_cpu_s"] = service.check_cpu_s

    def autograding(self, count, keeper, no_feedback):
        for _ in range(count):
            job = self.finished.get()
            try:
                autograde(job, keeper)
            except Exception as exc:  # noqa: BLE001
                job.error = job.error or f"{type(exc).__name__}: {clean(exc)[:300]}"
            if no_feedback or job.error:
                self.done(job)
            else:
                self.to_feedback.put(job)
        self.to_feedback.put(None)

    def feedback(self, keeper):
        while (job := self.to_feedback.get()) is not None:
            try:
                feedback(job, keeper)
            except Exception as exc:  # noqa: BLE001
                job.notes.append(f"feedback could not be generated: {type(exc).__name__}")
            self.done(job)

    def done(self, job):
        """Bookkeeping is over for `job`: keep what the report needs, remove its work folders."""
        job.oom_note = looks_out_of_memory(job)
        for folder in (os.path.dirname(job.ctl_dir),
                       os.path.join(self.work, "staged", job.student, job.lesson)):
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    def remove_empty_student_folders(self):
        """After the run, not in done(): a student's folder emptied there may be the one another of the
        student's lessons is being staged in at that moment (its makedirs then finds no parent)."""
        for kind in ("jobs", "staged"):
            base = os.path.join(self.work, kind)
            for name in os.listdir(base) if os.path.isdir(base) else ():
                try:
                    os.rmdir(os.path.join(base, name))
                except OSError:
                    pass  # not empty: something done() could not remove stays for `make clean`
