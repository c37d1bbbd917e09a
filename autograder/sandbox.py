"""Run one submission in a bubblewrap sandbox: own namespaces, no network, limited time, memory, processes.

What the sandbox holds (see the README's instructor guide):
- bubblewrap (`bwrap`, Debian package `bubblewrap`) gives the run new PID, network, IPC, UTS and cgroup
  namespaces and a private filesystem view (autograder/sandbox_command.py): nothing of the course but
  the read-only library and the submission; /proc/sys read-only; a seccomp filter that denies the key
  management calls (keyrings outlive a uid's processes) and new user namespaces (autograder/seccomp.py);
  bwrap's options reach it through a memfd, so /proc/1/cmdline shows no host path.
- Three uids: `sandbox_init.py` starts as root with CAP_SETUID/SETGID/CHOWN/KILL, prepares the home
  folder and becomes the executor's own uid (no file of the host belongs to it) keeping only
  CAP_SETUID/SETGID/KILL; the executor starts the kernel, which drops to the student's uid with no
  capabilities (kernel_launch.py) under RLIMIT_AS, RLIMIT_NPROC, RLIMIT_CPU, RLIMIT_FSIZE. Each parallel
  slot leases its pair of uids (a lock file under /run/lock/longctx-grader), so two `make grade` runs
  at once never share one.
- Every run gets a cgroup (autograder/cgroups.py, v1 or v2) limiting the memory (no swap beyond it),
  processes and CPU cores of all its processes together; without one, `check()` refuses to grade.
- The wall-clock limit is enforced twice: the executor stops at the deadline, and the grader kills the
  whole sandbox (its PID namespace dies with it) shortly after.

Must be run as root (the uid switch and the bind mounts need it); `check()` says what is missing.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import cgroups
import seccomp
from executor_output import MAX_CELL_OUTPUT_CHARS, MAX_NOTEBOOK_OUTPUT_CHARS
from sandbox_command import build_command, options_fd, write_kernelspec

BASE_UID = 61000
UID_RANGE = 4000
EXECUTOR_UID_OFFSET = 10000      # the executor of the slot whose kernel has uid U runs as U + 10000
UID_LOCK_DIR = "/run/lock/longctx-grader"


@dataclass
class Limits:
    wall_s: float = 600.0            # per notebook
    cell_timeout_s: float = 120.0    # per cell
    memory_bytes: int = 4 * 2**30    # address space of the kernel process (RLIMIT_AS) and cgroup limit
    max_processes: int = 256         # processes + threads of the sandbox user (RLIMIT_NPROC)
    max_file_bytes: int = 256 * 2**20
    tmpfs_bytes: int = 512 * 2**20   # home and /tmp, each
    max_cell_output_chars: int = MAX_CELL_OUTPUT_CHARS  # every kind of output, whole messages, as written
    max_notebook_output_chars: int = MAX_NOTEBOOK_OUTPUT_CHARS  # all cells together; beyond, dropped
    executor_memory_bytes: int = 2 * 2**30       # the executor's RLIMIT_AS (it holds the notebook's outputs)
    executor_file_bytes: int = 64 * 2**20        # the executor's RLIMIT_FSIZE (its outputs file stays below)
    threads: int = 1                 # OMP / MKL / torch threads, and the CPU quota in cores
    call_timeout_s: float = 20.0     # one call of the student's code made by a checker
    test_timeout_s: float = 300.0    # one test cell's checker, all its calls included
    checker_cpu_s: float = 60.0      # CPU seconds of one test cell's checker child (RLIMIT_CPU)
    # PYTHONWARNINGS in the kernel; "default" shows them (the course's own tests)
    python_warnings: str = "ignore"

    def cgroup_memory_bytes(self) -> int:
        """The run's total: the kernel, its two tmpfs mounts, the executor and bwrap."""
        return self.memory_bytes + 2 * self.tmpfs_bytes + 512 * 2**20


@dataclass
class RunResult:
    state: str                       # finished | timeout | kernel_died | error | sandbox_failed
    detail: str = ""
    cells_done: int = 0
    failed_cell: int | None = None
    timeouts: list = field(default_factory=list)
    truncated_cells: list = field(default_factory=list)
    output_cut_at: int | None = None  # the cell where the notebook's total output cap was reached
    kernel_exit: int | None = None
    process_limit_cells: list = field(default_factory=list)
    elapsed_s: float = 0.0
    sandbox_log: str = ""
    oom_killed: bool = False
    status: dict = field(default_factory=dict)  # the executor's status.json (timings included)


def check(allow_no_cgroups: bool = False) -> list[str]:
    """Return what is missing for sandboxed grading, as sentences an instructor can act on."""
    problems = []
    if sys.platform != "linux":
        problems.append("sandboxed grading needs Linux (namespaces); this is " + sys.platform)
        return problems
    if os.geteuid() != 0:
        problems.append("`make grade` must run as root (e.g. `sudo make grade`, or in the CI container): "
                        "the sandbox switches each notebook to an unprivileged user and mounts its view")
    if shutil.which("bwrap") is None:
        problems.append("bubblewrap is not installed: `apt-get install -y bubblewrap` (Debian/Ubuntu) or "
                        "`dnf install bubblewrap`")
    if problems:
        return problems
    probe = subprocess.run(["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--ro-bind", "/",
                            "/", "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        problems.append("bubblewrap is installed but cannot create namespaces here "
                        f"({probe.stderr.strip() or probe.returncode}); a container needs to allow "
                        "unshare/mount (e.g. docker --privileged or --security-opt seccomp=unconfined)")
    problems += [p for p in (seccomp.unprotected_here(),) if p]
    host = cgroups.detect()
    if host.kind is None and not allow_no_cgroups:
        problems.append(f"{host.problem}. Grading without cgroups would leave only per-process limits "
                        "(RLIMIT_AS per process, up to --max-processes of them); `--allow-no-cgroups` grades "
                        "anyway (autograder/README.md: cgroups)")
    return problems


def _is_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


class UidLease:
    """An unprivileged uid (the kernel's) and its executor's uid, held for one parallel slot of one run.

    A flock'd file per uid; skips uids where either belongs to a user of this machine; released by
    `release()` or when the process ends.
    """

    def __init__(self):
        os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
        for uid in range(BASE_UID, BASE_UID + UID_RANGE):
            if _is_user(uid) or _is_user(uid + EXECUTOR_UID_OFFSET):
                continue  # a real user: never borrow it
            fd = os.open(os.path.join(UID_LOCK_DIR, f"{uid}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self.fd = uid, fd
            return
        raise RuntimeError(f"no free grading uid in {BASE_UID}..{BASE_UID + UID_RANGE - 1}")

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _job_file(uid: int, limits: Limits, test_cells) -> dict:
    return {"uid": uid, "gid": uid, "executor_uid": uid + EXECUTOR_UID_OFFSET, "deadline_s": limits.wall_s,
            "cell_timeout_s": limits.cell_timeout_s, "max_cell_output_chars": limits.max_cell_output_chars,
            "max_notebook_output_chars": limits.max_notebook_output_chars,
            "executor_memory_bytes": limits.executor_memory_bytes,
            "executor_file_bytes": limits.executor_file_bytes,
            "memory_bytes": limits.memory_bytes, "cpu_s": int(limits.wall_s * max(1, limits.threads)) + 60,
            "max_processes": limits.max_processes, "max_file_bytes": limits.max_file_bytes,
            "test_cells": sorted(test_cells or []), "socket": "/ctl/grader.sock",
            "call_timeout_s": limits.call_timeout_s}


def _seccomp_pipe():
    """A pipe holding the seccomp program (its read end goes to bwrap), or None where none is known."""
    program = seccomp.sandbox_filter()
    if program is None:
        return None
    read_fd, write_fd = os.pipe()
    os.write(write_fd, program)  # a few dozen bytes: fits the pipe's buffer
    os.close(write_fd)
    return read_fd


def run(*, course_root: str, ctl_dir: str, submission_dir: str, uid: int, limits: Limits,
        test_cells: list[int] | None = None, extra_ro: list[str] | None = None,
        cgroup_host: cgroups.CgroupHost | None = None) -> RunResult:
    """Execute ctl_dir/input.ipynb in a sandbox; results land in ctl_dir (outputs.jsonl, status.json).

    At each cell index in `test_cells` the executor asks the grader, over ctl_dir/grader.sock (which the
    caller listens on), to check that test, and relays the checker's plain-data requests to the kernel.
    """
    os.makedirs(ctl_dir, exist_ok=True)
    os.chmod(ctl_dir, 0o700)
    for name in ("outputs.jsonl", "status.json"):
        if os.path.exists(os.path.join(ctl_dir, name)):
            os.remove(os.path.join(ctl_dir, name))
    with open(os.path.join(ctl_dir, "job.json"), "w") as fh:
        json.dump(_job_file(uid, limits, test_cells), fh)
    write_kernelspec(ctl_dir)
    seccomp_fd = _seccomp_pipe()
    cmd = build_command(course_root=course_root, ctl_dir=ctl_dir, submission_dir=submission_dir,
                        limits=limits, extra_ro=extra_ro, seccomp_fd=seccomp_fd)
    cgroup = None
    if cgroup_host is not None and cgroup_host.kind:
        cgroup = cgroups.Cgroup(cgroup_host, f"longctx-grader-{uid}", limits.cgroup_memory_bytes(),
                                limits.max_processes + 64, max(1, limits.threads))
    start = time.monotonic()
    log = _CappedLog()
    args_fd, cmd = options_fd(cmd)
    fds = (args_fd,) + ((seccomp_fd,) if seccomp_fd is not None else ())
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=cgroup.enter if cgroup else None, pass_fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    reader = threading.Thread(target=log.drain, args=(proc.stdout,), daemon=True)
    reader.start()
    killed = False
    try:
        proc.wait(timeout=limits.wall_s + 30)
    except subprocess.TimeoutExpired:
        killed = True
        _kill(proc)
    reader.join(timeout=10)
    elapsed = time.monotonic() - start
    oom = cgroup.oom_killed() if cgroup else False
    if cgroup:
        cgroup.remove()
    return _result(_read_status(os.path.join(ctl_dir, "status.json")), proc, killed, oom, elapsed, log,
                   limits)


def _result(status, proc, killed, oom, elapsed, log, limits) -> RunResult:
    result = RunResult(state=status.get("state", "sandbox_failed"), detail=status.get("detail", ""),
                       cells_done=status.get("cells_done", 0), failed_cell=status.get("failed_cell"),
                       timeouts=status.get("timeouts", []), truncated_cells=status.get("truncated_cells", []),
                       output_cut_at=status.get("output_cut_at"), kernel_exit=status.get("kernel_exit"),
                       process_limit_cells=status.get("process_limit_cells", []), elapsed_s=round(elapsed, 1),
                       sandbox_log=log.text(), oom_killed=oom, status=status)
    if killed:
        result.state, result.detail = "timeout", f"the notebook ran past its {limits.wall_s:g} s time limit"
    elif result.state in ("starting", "running"):
        result.state = "sandbox_failed" if proc.returncode else "error"
        result.detail = (f"the grading process stopped unexpectedly (exit status {proc.returncode}); "
                         f"last output: {log.text()[-400:].strip()}")
    if oom and result.state == "kernel_died":
        result.detail = "the kernel was killed for using more than the memory limit (out of memory)"
    return result


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _read_status(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


class _CappedLog:
    """Keeps the first and last 16 KiB of a stream and discards the rest (a 100 MB print costs nothing)."""

    def __init__(self, keep=16384):
        self.keep = keep
        self.head = b""
        self.tail = b""
        self.dropped = 0

    def drain(self, stream):
        while True:
            chunk = stream.read(65536)
            if not chunk:
                break
            if len(self.head) < self.keep:
                room = self.keep - len(self.head)
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail = (self.tail + chunk)[-self.keep:]
                self.dropped += len(chunk)
        self.dropped = max(0, self.dropped - len(self.tail))

    def text(self):
        mid = f"\n[... {self.dropped} bytes dropped ...]\n".encode() if self.dropped else b""
        return (self.head + mid + self.tail).decode("utf-8", "replace")


def limits_dict(limits: Limits) -> dict:
    return asdict(limits)
