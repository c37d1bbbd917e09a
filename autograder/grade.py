"""Autograde every submission under autograder/submitted/<student>/<lesson>/ safely and fairly.

    python autograder/grade.py [--jobs N] [--lesson ID ...] [--student ID ...]      (what `make grade` runs)

The guarantee (autograder/README.md): the checks, their expected values and the hidden tests never run
in, and are never sent to, a process that ran student code; nothing of the student runs outside its
sandbox. Steps:
0. Refuse without a sandbox (root, bubblewrap) or cgroups (v1, or v2 in a delegated subtree) and say why.
1. Start the checker fork server (autograder/checker.py, the instructor's library preloaded) before
   reading any submission. Register the lessons: `generate_assignment` into a private release folder
   (autograder/.work/release), which creates autograder/gradebook.db on a fresh clone and never touches
   lessons/.
2. Stage each submission (autograder/pipeline.py, N at a time): copy its notebook (and files the lesson
   ships; a regular file, no link, no hard link, bounded size; every other file is listed as ignored) to
   autograder/.work/staged; a folder whose name is not a whole match of the student-id pattern is graded
   under a safe alias (`-alias-` and a hash, kept across runs in autograder/.work/aliases.json; a folder
   named like an alias is refused). Check the notebook in a limited child with a time limit (JSON,
   nbformat, at most twice the lesson's cells, 20 MiB as written; only what grading uses is kept); one
   that fails is replaced by the blank lesson.
3. Sanitize with nbgrader's own preprocessors, cell roles restored from the lesson first (test cells
   restored, deleted ones added back), then blank every test cell: the sandbox gets the student's cells only.
4. Execute it in its own sandbox (autograder/sandbox.py). At each test cell the sandbox's executor asks
   this process to check it: a fresh, limited checker child runs the instructor's test source from
   solutions/ (by grade_id) and gets only plain data from the student's kernel (values, results of calling
   the student's functions, a scheduler's decisions), relayed by this process. Its verdict is the test's.
5. As each submission finishes, a bookkeeping worker (autograder/bookkeeper.py; nbgrader's `autograde`
   with the verdicts as the test cells' outputs) records it and a second one renders its feedback, each
   worker in a cgroup of its own under RLIMIT_AS, each task with a time limit; then its work folders
   are removed. Finally grades.csv (`nbgrader export`'s columns), a report per student under
   autograder/reports/, and a summary table (skipped folders listed with the reason, names quoted).
   Every per-submission step is contained: a submission that breaks one is graded 0 with the reason,
   and the others are graded as usual. Written answers (nbgrader's manually graded
   cells) stay pending until graded in the formgrader (autograder/formgrade.sh): reports and summary say
   so, and the next run shows the final total.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

# jsonschema (through nbformat) imports rfc3987_syntax for one format check notebooks never use; that
# import costs ~1.2 s of CPU in every process that reads a notebook. Skip it.
sys.modules.setdefault("rfc3987_syntax", None)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cgroups  # noqa: E402
import sandbox  # noqa: E402
from bookkeeper_client import Bookkeeper  # noqa: E402
from checkservice import start_checker_server  # noqa: E402
from pipeline import Job, Run  # noqa: E402
from preparation import solution_cells  # noqa: E402
from reports import log, print_summary, write_reports, write_timings  # noqa: E402
from staging import (  # noqa: E402
    ALIASES_FILE,
    clean,
    discover,
    legacy_aliases,
    load_aliases,
    save_aliases,
)


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", "-j", type=int, default=int(os.environ.get("JOBS") or os.cpu_count() or 1),
                   help="submissions graded in parallel (default: $JOBS or the number of cores)")
    p.add_argument("--lesson", action="append", default=[], help="grade only this lesson (repeatable)")
    p.add_argument("--student", action="append", default=[], help="grade only this student (repeatable)")
    p.add_argument("--course-root", default=os.path.dirname(HERE), help=argparse.SUPPRESS)
    p.add_argument("--wall-s", type=float, default=600.0, help="time limit per notebook (s)")
    p.add_argument("--cell-timeout-s", type=float, default=120.0,
                   help="time limit per cell of the notebook (s)")
    p.add_argument("--test-timeout-s", type=float, default=300.0,
                   help="time limit per test cell, all its calls of the student's code included (s)")
    p.add_argument("--checker-cpu-s", type=float, default=60.0,
                   help="CPU seconds the grader spends checking one test cell, decoding the answers included")
    p.add_argument("--call-timeout-s", type=float, default=20.0,
                   help="time limit of one call of the student's code made by a test (s)")
    p.add_argument("--memory-gib", type=float, default=4.0, help="memory limit per notebook (GiB)")
    p.add_argument("--max-processes", type=int, default=256, help="processes+threads per notebook")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    p.add_argument("--python-warnings", default="ignore", choices=["ignore", "default"],
                   help="Python warnings in the student's kernel: hidden (default) or shown as stderr output")
    p.add_argument("--allow-no-cgroups", action="store_true",
                   help="grade even where no cgroup can limit a submission's processes together (not safe)")
    p.add_argument("--timings", default="", help=argparse.SUPPRESS)  # JSON file of per-phase timings
    return p.parse_args(argv)


def safe_host(args):
    """The cgroup host to grade under (its `kind` None with --allow-no-cgroups), or None after saying why
    this machine cannot grade safely."""
    problems = sandbox.check(**({"allow_no_cgroups": True} if args.allow_no_cgroups else {}))
    host = cgroups.detect()
    if not problems and host.kind:
        try:
            host.activate()
        except OSError as exc:
            problems.append(f"could not set up cgroup {host.kind} limits in {host.base or host.root}: {exc}")
    if not problems:
        return host
    log("make grade: cannot grade safely on this machine:")
    for problem in problems:
        log(f"  - {problem}")
    log("Run `autograder/check_sandbox.sh` for details (see the README's instructor guide).")
    return None


def main(argv=None):
    args = parse_args(argv)
    root = os.path.abspath(args.course_root)
    venv_bin = os.path.dirname(sys.executable)
    os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")  # nbgrader runs `alembic`
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    host = safe_host(args)
    if host is None:
        return 2

    ctx = start_checker_server(root)  # first: it warms up while nbgrader loads
    import warnings

    warnings.filterwarnings("ignore")
    import bookkeeper

    t_start = time.monotonic()
    work = os.path.join(root, "autograder", ".work")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o700)
    config = bookkeeper.load_config(root, work)
    sol_dir = os.path.join(root, "solutions")
    solutions = (sorted(d for d in os.listdir(sol_dir)
                        if os.path.isfile(os.path.join(sol_dir, d, f"{d}.ipynb")))
                 if os.path.isdir(sol_dir) else [])
    try:
        aliases = load_aliases(work)
    except RuntimeError as exc:
        log(f"make grade: {exc}")
        return 1
    if not aliases and not os.path.exists(os.path.join(work, ALIASES_FILE)):
        aliases = legacy_aliases(root, gradebook_students(root))
    found, skipped, ids = discover(root, set(args.lesson), set(args.student), set(solutions), aliases)
    save_aliases(work, aliases)
    for student, lesson, why in skipped:
        log(f"skipped {clean(student)}/{clean(lesson)}: {clean(why)}")
    if not found and not skipped:
        log("no submissions found under autograder/submitted/<student>/<lesson>/")
        return 0

    lesson_info = register_lessons(bookkeeper.make_api(config), root, work,
                                   sorted({lesson for *_, lesson in found}))
    if lesson_info is None:
        return 1
    cgroup_host = host if host.kind else None
    keeper = Bookkeeper(root, work, cgroup_host, "bookkeeper")
    feedback_keeper = Bookkeeper(root, work, cgroup_host, "feedback")
    log(f"bookkeeping and feedback workers: {keeper.limits_note()}")
    for k in (keeper, feedback_keeper):  # start both now, while the first sandboxes run
        threading.Thread(target=lambda k=k: k.ask({"op": "noop"}, 120), daemon=True).start()
    run = Run(root, work, config, ctx, limits_from(args), lesson_info, cgroup_host, extra_read_only_paths())
    jobs = [Job(student, lesson, folder=folder, ctl_dir=os.path.join(work, "jobs", student, lesson, "ctl"))
            for student, folder, lesson in found]
    try:
        return _finish(root, run, jobs, keeper, feedback_keeper, skipped, ids, args, t_start)
    finally:
        keeper.remove()
        feedback_keeper.remove()


def _finish(root, run, jobs, keeper, feedback_keeper, skipped, ids, args, t_start):
    """Grade the jobs, export grades.csv, write the reports and the summary; 0 when grades.csv is written."""
    run.grade_all(jobs, keeper, feedback_keeper, args.jobs, args.no_feedback)
    feedback_keeper.close()
    graded = {job.student for job in jobs}
    for student in sorted({s for s, _, _ in skipped if s in ids.values()} - graded):
        keeper.ask({"op": "add_student", "student": student}, 60)  # listed in grades.csv with 0
    exported = keeper.ask({"op": "export", "dest": os.path.join(root, "autograder", "grades.csv")}, 300)
    keeper.close()
    if not exported.get("ok"):
        log("could not write grades.csv: " + clean(exported.get("error", "")))
    aliases = {student: folder for folder, student in ids.items() if folder != student}
    write_reports(root, jobs, skipped, aliases)
    elapsed = time.monotonic() - t_start
    print_summary(jobs, elapsed, skipped, aliases)
    if args.timings:
        write_timings(args.timings, jobs, elapsed, args.jobs)
    return 0 if exported.get("ok") else 1


def gradebook_students(root) -> set:
    """The student ids of an existing gradebook (read-only; an empty set when there is none)."""
    import sqlite3

    path = os.path.join(root, "autograder", "gradebook.db")
    if not os.path.isfile(path):
        return set()
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return {row[0] for row in db.execute("SELECT id FROM student")}
        finally:
            db.close()
    except sqlite3.Error:
        return set()


def register_lessons(api, root, work, lessons):
    """nbgrader's generate_assignment for each lesson (creates the gradebook); the test cells from
    solutions/."""
    lesson_info = {}
    for lesson in lessons:
        result = api.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            log(f"could not register lesson {lesson}:\n{result.get('error') or result.get('log')}")
            return None
        lesson_info[lesson] = solution_cells(root, lesson, os.path.join(work, "release"))
    return lesson_info


def limits_from(args):
    return sandbox.Limits(wall_s=args.wall_s, cell_timeout_s=args.cell_timeout_s,
                          memory_bytes=int(args.memory_gib * 2**30), max_processes=args.max_processes,
                          threads=max(1, (os.cpu_count() or 1) // max(1, args.jobs)),
                          call_timeout_s=args.call_timeout_s, test_timeout_s=args.test_timeout_s,
                          checker_cpu_s=args.checker_cpu_s,
                          python_warnings=args.python_warnings)


def extra_read_only_paths():
    """Extra folders the lessons may read ($LONGCTX_GRADER_READONLY); the model cache is always mounted."""
    paths = [p for p in os.environ.get("LONGCTX_GRADER_READONLY", "").split(os.pathsep) if p]
    return [os.path.abspath(p) for p in paths if os.path.isdir(p)]


if __name__ == "__main__":
    sys.exit(main())
