"""The grader's own cost per submission, beyond the notebook's execution, and its throughput with -j.

    python benchmarks/grading.py [--lesson 00_start_here] [--submissions 8] [--jobs 1 2] [--compare REV]

Builds a temporary copy of the course with one lesson, submits its solution N times, runs
`autograder/grade.py --jobs J --timings ...` for each J, and prints, per submission (mean over N):

    notebook    wall time of the student's cells in the kernel (what a plain run of the notebook costs)
    kernel      starting the kernel in the sandbox
    sandbox     bubblewrap + the executor's start and finish (sandbox wall - cells - tests - kernel)
    checks      the test cells: checker children and the plain-data round trips to the kernel
    prepare     staging + nbgrader's sanitizing + planning the checks
    gradebook   nbgrader autograde into the gradebook (bookkeeping worker)
    feedback    nbgrader generate_feedback (sanitized HTML)
    overhead    everything above except `notebook` (the target is <= 3 s per submission)
and the run's wall time and throughput (submissions per minute); then the same parts in CPU seconds
(measured by each process itself: executor, kernel start, checker children plus the kernel's answers,
staging/prepare thread, bookkeeping worker), which do not depend on how loaded the machine is.
Needs root and bubblewrap (as `make grade`). `--compare REV` also grades the same submissions with the
grader of git revision REV (its autograder/ only; the same library and lesson), alternating the two runs
for each -j, and prints each part's ratio (this tree / REV): the way to show a change's cost per submission.

The machine's load average is printed with each run: on a shared machine, wall times are noisy;
compare runs made at the same load, or the CPU table.

Recorded 2026-12-02, issue 23's grader against the one before it (`--compare 64be9d8`, lesson 00,
6 submissions, 2 cores shared with other sessions; the two graders alternate for each -j; load average
at each run's start in the table):

    grader   jobs load notebook kernel sandbox checks prepare gradebook feedback overhead per sub per min
    64be9d8    1   0.7    2.72    1.13    1.08   0.30    0.10     0.40     0.44     3.45    7.21    8.32
    tree       1   1.0    2.60    1.00    1.07   0.20    0.18     0.43     0.50     3.37    7.11    8.44
    64be9d8    2   1.3    6.13    2.78    2.57   0.68    0.43     1.15     1.20     8.80    7.55    7.95
    tree       2   4.2    5.93    2.53    2.37   0.34    0.71     1.23     1.56     8.74    7.65    7.84
    CPU s    jobs nb_cpu kernel executor checks prepare gradebook feedback overhead_cpu
    64be9d8    1   2.83   0.79    0.89   0.31    0.09     0.38     0.43     2.89
    tree       1   2.64   0.67    0.83   0.17    0.11     0.36     0.45     2.59
    64be9d8    2   2.77   0.79    0.95   0.27    0.09     0.39     0.49     2.99
    tree       2   2.80   0.79    0.92   0.18    0.12     0.34     0.53     2.88
    ratio tree / 64be9d8: -j 1 wall overhead 0.98, CPU 0.89; -j 2 wall overhead 0.99, CPU 0.96

(prepare now includes the notebook's check in a child process; checks got cheaper because the fork
server really preloads the grader's modules now. Not in the table: the second bookkeeping worker's
start, about 2.5 s of CPU once per run, in parallel with the first sandboxes; the run's wall time did not
change: 42.7 s against 43.3 s at -j 1, 45.9 s against 45.3 s at -j 2.)

(gradebook and feedback run in two bookkeeping workers, pipelined with the next sandboxes.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_course(tmp: str, lesson: str, grader_dir: str = os.path.join(REPO, "autograder")) -> str:
    root = os.path.join(tmp, "course")
    os.makedirs(os.path.join(root, "autograder"))
    for path in glob.glob(os.path.join(grader_dir, "*.py")):
        shutil.copy(path, os.path.join(root, "autograder", os.path.basename(path)))
    shutil.copytree(os.path.join(REPO, "longctx"), os.path.join(root, "longctx"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(REPO, "solutions", lesson), os.path.join(root, "solutions", lesson))
    return root


def submit(root: str, lesson: str, n: int) -> None:
    src = os.path.join(root, "solutions", lesson, f"{lesson}.ipynb")
    for i in range(n):
        folder = os.path.join(root, "autograder", "submitted", f"student{i:03d}", lesson)
        os.makedirs(folder, exist_ok=True)
        shutil.copy(src, os.path.join(folder, f"{lesson}.ipynb"))


def run(root: str, jobs: int) -> dict:
    timings = os.path.join(root, f"timings-j{jobs}.json")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               PYTHONWARNINGS="ignore")
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, os.path.join(root, "autograder", "grade.py"), "--jobs", str(jobs),
                           "--timings", timings], cwd=root, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"grade.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    data = json.load(open(timings))
    return {"jobs": jobs, "wall_s": wall, "load": load, "rows": data["submissions"]}


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def summarize(result: dict) -> dict:
    rows = result["rows"]
    parts = {
        "notebook": mean(r["cells_s"] for r in rows),
        "kernel": mean(r["kernel_start_s"] for r in rows),
        "sandbox": mean(max(0.0, r["sandbox_s"] - r["cells_s"] - r.get("check_s", 0.0) - r["kernel_start_s"])
                        for r in rows),
        "checks": mean(r.get("check_s", 0.0) for r in rows),
        "prepare": mean(r.get("prepare_s", 0.0) for r in rows),
        "gradebook": mean(r.get("autograde_s", 0.0) for r in rows),
        "feedback": mean(r.get("feedback_s", 0.0) for r in rows),
    }
    parts["overhead"] = sum(v for k, v in parts.items() if k != "notebook")
    n = len(rows)
    parts.update(wall_per_sub=result["wall_s"] / n, per_min=60.0 * n / result["wall_s"])
    cpu = {
        "nb_cpu": mean(r.get("kernel_cpu_s", 0.0) - r.get("kernel_start_cpu_s", 0.0)
                       - r.get("answers_cpu_s", 0.0)
                       for r in rows),
        "kernel_cpu": mean(r.get("kernel_start_cpu_s", 0.0) for r in rows),
        "executor_cpu": mean(r.get("executor_cpu_s", 0.0) for r in rows),
        "checks_cpu": mean(r.get("check_cpu_s", 0.0) + r.get("answers_cpu_s", 0.0) for r in rows),
        "prepare_cpu": mean(r.get("prepare_cpu_s", 0.0) for r in rows),
        "gradebook_cpu": mean(r.get("autograde_cpu_s", 0.0) for r in rows),
        "feedback_cpu": mean(r.get("feedback_cpu_s", 0.0) for r in rows),
    }
    cpu["overhead_cpu"] = sum(v for k, v in cpu.items() if k != "nb_cpu")
    parts.update(cpu)
    return parts


def grader_of(rev: str, tmp: str) -> str:
    """The autograder/ folder of git revision `rev`, extracted under tmp."""
    dest = os.path.join(tmp, "grader-" + rev.replace("/", "_"))
    os.makedirs(dest)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev, "autograder"], capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return os.path.join(dest, "autograder")


WALLS = ["notebook", "kernel", "sandbox", "checks", "prepare", "gradebook", "feedback", "overhead",
         "wall_per_sub", "per_min"]
CPUS = ["nb_cpu", "kernel_cpu", "executor_cpu", "checks_cpu", "prepare_cpu", "gradebook_cpu", "feedback_cpu",
        "overhead_cpu"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lesson", default="00_start_here")
    p.add_argument("--submissions", type=int, default=8)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--compare", default="", help="also grade with the grader of this git revision")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grading-bench-") as tmp:
        graders = [("tree", os.path.join(REPO, "autograder"))]
        if args.compare:
            graders.insert(0, (args.compare[:10], grader_of(args.compare, tmp)))
        roots = {}
        for name, folder in graders:
            roots[name] = make_course(os.path.join(tmp, name), args.lesson, folder)
            submit(roots[name], args.lesson, args.submissions)
        results = [(name, run(roots[name], j)) for j in args.jobs for name, _ in graders]
    print(f"lesson {args.lesson}, {args.submissions} submissions, {os.cpu_count()} cores; "
          "means per submission")
    print("wall seconds (per_min = submissions graded per minute):")
    print(f"{'grader':>10} {'jobs':>4} {'load':>5} " + " ".join(f"{c:>12}" for c in WALLS)
          + f" {'run wall s':>11}")
    summaries = [(name, result, summarize(result)) for name, result in results]
    for name, result, s in summaries:
        print(f"{name:>10} {result['jobs']:>4} {result['load']:>5.1f} "
              + " ".join(f"{s[c]:>12.2f}" for c in WALLS)
              + f" {result['wall_s']:>11.1f}")
    print("CPU seconds (independent of the machine's load; nb_cpu = the student's cells):")
    print(f"{'grader':>10} {'jobs':>4} " + " ".join(f"{c:>13}" for c in CPUS))
    for name, result, s in summaries:
        print(f"{name:>10} {result['jobs']:>4} " + " ".join(f"{s[c]:>13.2f}" for c in CPUS))
    if args.compare:
        print(f"ratio tree / {args.compare[:10]} (overhead per submission):")
        for j in args.jobs:
            old, new = [s for name, r, s in summaries if r["jobs"] == j]
            print(f"  -j {j}: wall overhead {new['overhead'] / old['overhead']:.2f}, "
                  f"CPU overhead {new['overhead_cpu'] / old['overhead_cpu']:.2f}")


if __name__ == "__main__":
    main()
