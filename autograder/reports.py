"""What `make grade` tells people: a plain-text report per student, the summary table, per-phase timings."""

from __future__ import annotations

import json
import os

from executor_output import read_outputs
from staging import MAX_NOTEBOOK_BYTES, clean, is_student_id, shown


def log(msg):
    """Print the grader's own message: its line breaks are kept, any other control or bidi character is
    escaped. Student strings inside it must have been through clean() already (their line breaks escaped)."""
    print(_lines(msg), flush=True)


def _lines(text):
    return "\n".join(clean(line) for line in str(text).split("\n"))


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



def write_timings(path, jobs, elapsed, n_jobs):
    rows = []
    for job in jobs:
        r = job.result
        status = r.status if r is not None else {}
        keys = ("cells_s", "kernel_start_s", "kernel_start_cpu_s", "executor_cpu_s", "kernel_cpu_s",
                "answers_cpu_s", "executor_max_rss_kib")
        rows.append({"student": job.student, "lesson": job.lesson, "state": r.state if r else "not run",
                     "sandbox_s": r.elapsed_s if r else 0.0, **{k: status.get(k, 0.0) for k in keys},
                     **job.timings})
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


def _score_text(job):
    """The total, or while written answers await manual grading, what is graded so far and what is pending."""
    pending = sum(m for _, m in job.pending)
    if not job.pending:
        return f"{job.score:g} / {job.max_score:g} points"
    graded = "graded" if job.hand_graded else "autograded"
    return f"{job.score:g} / {job.max_score - pending:g} {graded}, {pending:g} points pending manual grading"


def report_lines(job):
    r = job.result
    lines = [f"{job.lesson}: {_score_text(job)} - {_status_text(job)}"]
    if r is not None:
        lines.append(f"  ran {r.elapsed_s:.1f} s; {clean(r.detail)}" if r.detail
                     else f"  ran {r.elapsed_s:.1f} s")
        if r.timeouts:
            lines.append(f"  cells stopped by the per-cell time limit: {', '.join(map(str, r.timeouts))}")
        if r.truncated_cells:
            lines.append(f"  cells whose output was cut: {', '.join(map(str, r.truncated_cells))}")
        if r.output_cut_at is not None:
            lines.append(f"  output truncated: the notebook's outputs passed the grader's total cap; outputs "
                         f"from cell {r.output_cut_at} on were dropped")
        if r.process_limit_cells:
            lines.append("  process limit: cells " + ", ".join(map(str, r.process_limit_cells)) +
                         " left too many processes behind (a fork bomb?); they were stopped")
    oom = job.oom_note
    if oom:
        lines.append(f"  out of memory: {oom}")
    for name, score, max_score, message in job.tests:
        if score is None:
            lines.append(f"  [PENDING] {name}: ?/{max_score:g} - written answer awaiting manual grading "
                         "(autograder/README.md: Manually graded answers)")
            continue
        mark = "graded" if name in job.hand_graded else "passed" if score >= max_score else "FAILED"
        lines.append(f"  [{mark}] {clean(name)}: {score:g}/{max_score:g}"
                     + (f" - {clean(message)}" if message and (score < max_score or mark == "graded")
                        else ""))
    for note in job.notes:
        lines.append(f"  note: {clean(note)}")
    if job.flags:
        lines.append("  review: the notebook's own code uses " + clean(", ".join(job.flags)) +
                     " (the score does not depend on it: tests run outside the notebook's kernel)")
    if job.error:
        lines.append(f"  grading error: {clean(job.error)[-800:]}")
    return lines


def write_reports(root, jobs, skipped, aliases=None):
    """reports/<student>.txt for every student graded or skipped (a folder with an odd name: its alias)."""
    aliases = aliases or {}
    folder = os.path.join(root, "autograder", "reports")
    os.makedirs(folder, exist_ok=True)
    by_student = {}
    for job in jobs:
        by_student.setdefault(job.student, []).append(job)
    for s, _, _ in skipped:
        if is_student_id(s):
            by_student.setdefault(s, [])
    for student, js in by_student.items():
        lines = [f"Grading report for {student}", "=" * (21 + len(student)), ""]
        if student in aliases:
            lines += [f"(the folder autograder/submitted/{shown(aliases[student], 200)} has a name that "
                      f"cannot be a student id; it was graded as {student})", ""]
        for job in js:
            try:
                lines += report_lines(job)
            except Exception as exc:  # noqa: BLE001
                lines.append(f"{job.lesson}: {job.score:g} points (the report could not be written: "
                             f"{clean(repr(exc))})")
            lines.append("")
        for s, lesson, why in skipped:
            if s == student:
                lines.append(f"{clean(lesson)}: skipped - {clean(why)}")
        with open(os.path.join(folder, f"{student}.txt"), "w", encoding="utf-8",
                  errors="backslashreplace") as fh:
            fh.write(_lines("\n".join(lines)) + "\n")


def looks_out_of_memory(job):
    """Why the notebook looks out of memory ('' if not), from its cells' outputs (read before they are
    removed)."""
    outputs = read_outputs(os.path.join(job.ctl_dir, "outputs.jsonl"), None, 8 * MAX_NOTEBOOK_BYTES) \
        if job.ctl_dir else None
    text = json.dumps(outputs)[: 8 * MAX_NOTEBOOK_BYTES] if outputs else ""
    for needle in ("MemoryError", "can't allocate memory", "Cannot allocate memory", "std::bad_alloc"):
        if needle in text:
            return f"a cell raised {needle} (limit per notebook)"
    return ""


def print_summary(jobs, elapsed, skipped=(), aliases=None):
    aliases = aliases or {}
    header = f"{'student':<20} {'lesson':<28} {'score':>11}  status"
    log("")
    log(header)
    log("-" * len(header))
    for job in sorted(jobs, key=lambda j: (j.lesson, j.student)):
        pending = sum(m for _, m in job.pending)
        graded_max = job.max_score - pending
        log(f"{job.student:<20} {job.lesson:<28} {job.score:>5g}/{graded_max:<5g}  {_status_text(job)}"
            + (f"  [+{pending:g} points pending manual grading: {', '.join(n for n, _ in job.pending)}]"
               if job.pending else "")
            + (f"  [review: {clean(', '.join(job.flags))}]" if job.flags else "")
            + (f"  [folder: {shown(aliases[job.student], 120)}]" if job.student in aliases else ""))
    for student, lesson, why in skipped:
        log(f"{clean(student):<20} {clean(lesson):<28} {'0':>5}/{'-':<5}  skipped: {clean(why)}")
    log(f"\n{len(jobs)} submission(s) graded in {elapsed:.0f} s. grades.csv, feedback/ and reports/ are in "
        "autograder/."
        + (f" {len(skipped)} folder(s) skipped (listed above with the reason)." if skipped else ""))
    waiting = [job for job in jobs if job.pending]
    if waiting:
        answers = sum(len(job.pending) for job in waiting)
        log(f"{answers} written answer(s) in {len(waiting)} submission(s) await manual grading; until then "
            "grades.csv counts them as 0. Grade them in the formgrader, then run `make grade` again "
            "(autograder/README.md: Manually graded answers).")
