"""Autograde every submission under autograder/submitted/<student>/<lesson>/ safely and fairly.

    python autograder/grade.py [--jobs N] [--lesson ID ...] [--student ID ...]      (what `make grade` runs)

Steps (nbgrader does the bookkeeping; only the execution is replaced):
1. Register the lessons: `generate_assignment` into a private release folder (autograder/.work/release),
   which creates autograder/gradebook.db on a fresh clone and never touches lessons/.
2. Stage each submission: copy its regular files (no links, size-limited) to autograder/.work/staged.
   An unreadable notebook is replaced by the blank released lesson (it earns zero, and the report says so).
3. Sanitize with nbgrader's own preprocessors (test cells restored from the source, deleted test cells
   added back), then add to each test cell a first line that reloads longctx.grading from the read-only
   library and a last line that prints a secret per-cell marker: a test passes only when it ran to its end.
4. Execute every submission in its own sandbox (autograder/sandbox.py), N at a time.
5. One at a time (SQLite has one writer): `nbgrader autograde` with its Execute step replaced by the
   sandbox's result, then `generate_feedback`; finally grades.csv (`nbgrader export`'s columns), a report
   per student under autograder/reports/, and a summary table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import os
import queue
import re
import secrets
import shutil
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import sandbox  # noqa: E402

# nbgrader's gradebook code trips SQLAlchemy's autoflush notice for every new submission; it is noise
# on the instructor's terminal, not a problem with the grades.
warnings.filterwarnings("ignore", message=r".*not in session, add operation along.*")

MARKER_PREFIX = "LONGCTX-TEST-COMPLETED-"
MAX_NOTEBOOK_BYTES = 20 * 2**20
MAX_SUBMISSION_BYTES = 100 * 2**20
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
SUSPICIOUS = ["set_custom_exc", "run_cell", "sys.modules", "builtins", "__builtins__", "__import__", "ctypes",
              "os._exit", "settrace", "setprofile", "gc.get_referrers", "inspect.currentframe", "sys._getframe",
              "TorchFunctionMode", "__class__ =", "exec(", "eval(", "longctx.grading"]

RESULTS: dict = {}  # (student, lesson) -> Job, read by ReplayExecute inside nbgrader's autograde


@dataclass
class Job:
    student: str
    lesson: str
    staged_dir: str
    ctl_dir: str
    nonces: dict = field(default_factory=dict)        # cell index -> nonce
    notes: list = field(default_factory=list)
    flags: list = field(default_factory=list)
    result: sandbox.RunResult | None = None
    score: float = 0.0
    max_score: float = 0.0
    tests: list = field(default_factory=list)          # (name, score, max, message)
    error: str = ""
    autograded_dir: str = ""


# ----------------------------------------------------------------------------- configuration
def load_config(root: str, work: str):
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=os.path.join(root, "autograder")).load_config()
    override = Config()
    override.CourseDirectory.root = root
    override.CourseDirectory.submitted_directory = os.path.join(work, "staged")
    override.CourseDirectory.release_directory = os.path.join(work, "release")
    override.CourseDirectory.db_url = "sqlite:///" + os.path.join(root, "autograder", "gradebook.db")
    override.OverwriteCells.add_missing_cells = True
    override.OverwriteCells.missing_cell_notification = (
        "# This cell (id:{cell_id}) was missing from the submission; the grader added it back.\n")
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )

    override.Autograde.autograde_preprocessors = [_replay_class(), IgnorePattern, ClearMetadataPreprocessor,
                                                  LimitOutput, SaveAutoGrades, AssignLatePenalties,
                                                  CheckCellMetadata]
    config.merge(override)
    return config


def make_api(config):
    import logging

    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=config)
    api = NbGraderAPI(coursedir=coursedir, config=config)
    api.log.setLevel(logging.ERROR)
    return api


# ----------------------------------------------------------------------------- replay of sandbox results
def _replay_class():
    from nbgrader import utils
    from nbgrader.preprocessors import NbGraderPreprocessor

    class _ReplayExecute(NbGraderPreprocessor):
        """Stands in for nbgrader's Execute: copies in the outputs the sandbox produced, after checking them."""

        def preprocess(self, nb, resources):
            key = (resources["nbgrader"]["student"], resources["nbgrader"]["assignment"])
            job = RESULTS[key]
            executed = _read_executed(job)
            if executed is not None and len(executed.cells) != len(nb.cells):
                job.notes.append("the executed notebook did not match the submission; nothing was graded")
                executed = None
            reason = _stop_reason(job)
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                outputs = list(executed.cells[index].get("outputs", [])) if executed is not None else []
                cell.outputs = outputs
                cell.execution_count = None
                if utils.is_grade(cell) and not utils.is_solution(cell):
                    cell.outputs = _judge_test_cell(job, index, cell, outputs, reason)
            return nb, resources

    return _ReplayExecute


def _read_executed(job):
    import nbformat

    path = os.path.join(job.ctl_dir, "executed.ipynb")
    if not os.path.exists(path) or os.path.getsize(path) > 4 * MAX_NOTEBOOK_BYTES:
        return None
    try:
        return nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001
        return None


def _stop_reason(job):
    r = job.result
    if r is None:
        return "the notebook was not executed"
    if r.state == "timeout":
        return f"not run: {r.detail}"
    if r.state == "kernel_died":
        return f"not run: {r.detail} in an earlier cell"
    if r.state in ("error", "sandbox_failed"):
        return f"not run: the grader could not execute the notebook ({r.detail[:300]})"
    return "this test did not run to its end (its output was suppressed or the kernel stopped)"


def _judge_test_cell(job, index, cell, outputs, reason):
    """Keep errors and displays; drop stderr, results and markers; fail a test that did not complete."""
    from nbformat.v4 import new_output

    nonce = job.nonces.get(index)
    marker = f"{MARKER_PREFIX}{nonce}" if nonce else None
    completed, kept, errors = False, [], []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            if out.get("name") == "stderr":
                job.notes.append(f"test '{_grade_id(cell)}' wrote to stderr (not counted against it): "
                                 f"{text.strip()[:120]!r}")
                continue
            if marker and marker in text:
                completed = True
            text = "".join(line for line in text.splitlines(True) if not line.startswith(MARKER_PREFIX))
            if text:
                kept.append(new_output("stream", name=out.get("name", "stdout"), text=text))
        elif kind == "error":
            errors.append(new_output("error", ename=str(out.get("ename", "Error")),
                                     evalue=str(out.get("evalue", ""))[:4000],
                                     traceback=[f"{out.get('ename', 'Error')}: {str(out.get('evalue', ''))[:4000]}"]))
        elif kind == "display_data":
            kept.append(out)
    if errors:
        return kept + errors[:1]
    if not completed:
        return kept + [new_output("error", ename="TestNotCompleted", evalue=reason,
                                  traceback=[f"TestNotCompleted: {reason}"])]
    return kept


def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "?")


# ----------------------------------------------------------------------------- staging and preparation
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
            skipped.append((student, "*", "student folder name has unusual characters"))
            continue
        for lesson in sorted(os.listdir(sdir)):
            ldir = os.path.join(sdir, lesson)
            if not os.path.isdir(ldir) or os.path.islink(ldir) or (lessons_filter and lesson not in lessons_filter):
                continue
            if lesson not in solutions:
                skipped.append((student, lesson, "no such lesson in solutions/"))
                continue
            found.append((student, lesson))
    return found, skipped


def stage(root, work, student, lesson):
    """Copy regular files only (no links, devices, or oversized files) into the staging area."""
    src = os.path.join(root, "autograder", "submitted", student, lesson)
    dst = os.path.join(work, "staged", student, lesson)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    notes, total = [], 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = os.path.relpath(dirpath, src)
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))
                       and not d.startswith(".")]
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not (st.st_mode & 0o170000 == 0o100000):
                notes.append(f"ignored {os.path.join(rel, name)}: not a regular file (links are not followed)")
                continue
            total += st.st_size
            if st.st_size > MAX_NOTEBOOK_BYTES or total > MAX_SUBMISSION_BYTES:
                notes.append(f"ignored {os.path.join(rel, name)}: too large ({st.st_size} bytes)")
                continue
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            shutil.copyfile(path, os.path.join(dst, rel, name))
    return dst, notes


def prepare(job, config, root, work):
    """Sanitize with nbgrader's preprocessors, then arm the test cells; write ctl/input.ipynb."""
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
        nb = sanitize(nbformat.read(path, as_version=4))
    except Exception as exc:  # noqa: BLE001
        job.notes.append(f"the notebook could not be used ({type(exc).__name__}: {str(exc)[:200]}); "
                         "it was graded as the blank lesson")
        shutil.copyfile(blank, path)
        nb = sanitize(nbformat.read(path, as_version=4))

    def student_code(notebook):  # answer cells and cells the student added, not the lesson's own cells
        return "\n".join(c.source for c in notebook.cells if c.cell_type == "code" and
                          (utils.is_solution(c) or "nbgrader" not in c.get("metadata", {})))

    released_code = student_code(nbformat.read(blank, as_version=4))
    job.flags = sorted({w for w in SUSPICIOUS if w in student_code(nb) and w not in released_code})

    grading_path = os.path.join(root, "longctx", "grading.py")
    preamble = ("import sys as _lcg_sys, importlib.util as _lcg_iu, warnings as _lcg_w; "
                "_lcg_w.simplefilter('ignore'); "
                f"_lcg_spec = _lcg_iu.spec_from_file_location('longctx.grading', {grading_path!r}); "
                "_lcg_sys.modules['longctx.grading'] = _lcg_iu.module_from_spec(_lcg_spec); "
                "_lcg_spec.loader.exec_module(_lcg_sys.modules['longctx.grading']); "
                "del _lcg_sys, _lcg_iu, _lcg_w, _lcg_spec\n")
    armed = copy.deepcopy(nb)
    for index, cell in enumerate(armed.cells):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            nonce = secrets.token_hex(16)
            job.nonces[index] = nonce
            cell.source = f"{preamble}{cell.source}\nprint({MARKER_PREFIX + nonce!r}, flush=True)\n"
    os.makedirs(job.ctl_dir, exist_ok=True)
    os.chmod(job.ctl_dir, 0o700)
    nbformat.write(armed, os.path.join(job.ctl_dir, "input.ipynb"))


# ----------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", "-j", type=int, default=int(os.environ.get("JOBS") or 1),
                   help="submissions graded in parallel (default: $JOBS or 1)")
    p.add_argument("--lesson", action="append", default=[], help="grade only this lesson (repeatable)")
    p.add_argument("--student", action="append", default=[], help="grade only this student (repeatable)")
    p.add_argument("--course-root", default=os.path.dirname(HERE), help=argparse.SUPPRESS)
    p.add_argument("--wall-s", type=float, default=600.0, help="time limit per notebook (s)")
    p.add_argument("--cell-timeout-s", type=float, default=120.0, help="time limit per cell (s)")
    p.add_argument("--memory-gib", type=float, default=4.0, help="memory limit per notebook (GiB)")
    p.add_argument("--max-processes", type=int, default=256, help="processes+threads per notebook")
    p.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    return p.parse_args(argv)


def log(msg):
    print(msg, flush=True)


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

    work = os.path.join(root, "autograder", ".work")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o700)
    config = load_config(root, work)
    api = make_api(config)
    sol_dir = os.path.join(root, "solutions")
    solutions = sorted(d for d in os.listdir(sol_dir)
                       if os.path.isfile(os.path.join(sol_dir, d, f"{d}.ipynb"))) if os.path.isdir(sol_dir) else []
    pairs, skipped = discover(root, set(args.lesson), set(args.student), set(solutions))
    for student, lesson, why in skipped:
        log(f"skipped {student}/{lesson}: {why}")
    if not pairs:
        log("no submissions found under autograder/submitted/<student>/<lesson>/")
        return 0

    t0 = time.monotonic()
    for lesson in sorted({lesson for _, lesson in pairs}):
        result = api.generate_assignment(lesson, force=True, create=True)
        if not result["success"]:
            log(f"could not register lesson {lesson}:\n{result.get('error') or result.get('log')}")
            return 1

    jobs = []
    for student, lesson in pairs:
        staged, notes = stage(root, work, student, lesson)
        job = Job(student, lesson, staged, os.path.join(work, "jobs", student, lesson, "ctl"), notes=notes,
                  autograded_dir=os.path.join(root, "autograder", "autograded", student, lesson))
        prepare(job, config, root, work)
        RESULTS[(student, lesson)] = job
        jobs.append(job)

    limits = sandbox.Limits(wall_s=args.wall_s, cell_timeout_s=args.cell_timeout_s,
                            memory_bytes=int(args.memory_gib * 2**30), max_processes=args.max_processes,
                            threads=max(1, (os.cpu_count() or 1) // max(1, args.jobs)))
    slots = queue.Queue()
    for slot in range(max(1, args.jobs)):
        slots.put(slot)
    done_count = [0]
    lock = threading.Lock()

    def execute(job):
        slot = slots.get()
        try:
            job.result = sandbox.run(course_root=root, ctl_dir=job.ctl_dir, submission_dir=job.staged_dir,
                                     slot=slot, limits=limits, marker_prefix=MARKER_PREFIX,
                                     extra_ro=extra_read_only_paths())
        finally:
            slots.put(slot)
        with lock:
            done_count[0] += 1
            r = job.result
            log(f"[{done_count[0]:>3}/{len(jobs)}] executed {job.student}/{job.lesson}: {r.state} "
                f"in {r.elapsed_s:.1f} s{(' - ' + r.detail) if r.detail else ''}")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(execute, jobs))

    for job in jobs:  # serial: the gradebook is SQLite
        result = api.autograde(job.lesson, job.student, force=True, create=True)
        if not result["success"]:
            job.error = (result.get("error") or result.get("log") or "")[-1500:]
        elif not args.no_feedback:
            fb = api.generate_feedback(job.lesson, job.student, force=True)
            if not fb["success"]:
                job.notes.append("feedback could not be generated: " + (fb.get("error") or "")[-300:])
        collect_scores(job, config)

    export_grades(config, os.path.join(root, "autograder", "grades.csv"))
    write_reports(root, jobs, skipped)
    print_summary(jobs, time.monotonic() - t0)
    return 1 if any(job.error for job in jobs) else 0


def extra_read_only_paths():
    """Extra folders the lessons may read ($LONGCTX_GRADER_READONLY); the model cache is always mounted."""
    paths = [p for p in os.environ.get("LONGCTX_GRADER_READONLY", "").split(os.pathsep) if p]
    return [os.path.abspath(p) for p in paths if os.path.isdir(p)]


def collect_scores(job, config):
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(config.CourseDirectory.db_url) as gb:
        try:
            nb = gb.find_submission_notebook(job.lesson, job.lesson, job.student)
        except MissingEntry:
            job.error = job.error or "no grade was recorded"
            return
        job.score = float(nb.score or 0.0)
        job.max_score = float(nb.max_score or 0.0)
        for grade in nb.grades:
            job.tests.append((grade.name, float(grade.score or 0.0), float(grade.max_score or 0.0)))
    messages = _failure_messages(job)
    job.tests = [(name, s, m, messages.get(name, "")) for name, s, m in sorted(job.tests)]


def _failure_messages(job):
    import nbformat

    path = os.path.join(job.autograded_dir, f"{job.lesson}.ipynb")
    messages = {}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # noqa: BLE001
        return messages
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                messages[_grade_id(cell)] = f"{out.get('ename')}: {out.get('evalue')}"[:600]
    return messages


def export_grades(config, dest):
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    tmp = dest + ".tmp"
    with Gradebook(config.CourseDirectory.db_url) as gb:
        CsvExportPlugin(to=tmp).export(gb)
    os.replace(tmp, dest)


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


def write_reports(root, jobs, skipped):
    folder = os.path.join(root, "autograder", "reports")
    os.makedirs(folder, exist_ok=True)
    by_student = {}
    for job in jobs:
        by_student.setdefault(job.student, []).append(job)
    for student, js in by_student.items():
        lines = [f"Grading report for {student}", "=" * (21 + len(student)), ""]
        for job in js:
            r = job.result
            lines.append(f"{job.lesson}: {job.score:g} / {job.max_score:g} points - {_status_text(job)}")
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
                             " (can be legitimate; check by hand if the score looks too good)")
            if job.error:
                lines.append(f"  grading error: {job.error[-800:]}")
            lines.append("")
        for s, lesson, why in skipped:
            if s == student:
                lines.append(f"{lesson}: skipped - {why}")
        with open(os.path.join(folder, f"{student}.txt"), "w") as fh:
            fh.write("\n".join(lines) + "\n")


def _looks_out_of_memory(job):
    path = os.path.join(job.ctl_dir, "executed.ipynb")
    try:
        text = open(path).read(8 * MAX_NOTEBOOK_BYTES)
    except OSError:
        return ""
    for needle in ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc"):
        if needle in text:
            return f"a cell raised {needle} (limit {job.result and 'per notebook'})"
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
