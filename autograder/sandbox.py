"""Run one submission in a bubblewrap sandbox: own namespaces, no network, limited time, memory, processes.

What the sandbox holds (see the README's instructor guide):
- bubblewrap (`bwrap`, Debian package `bubblewrap`) gives the run new PID, network, IPC, UTS and cgroup
  namespaces and a private filesystem view: /usr, /etc and the virtual environment read-only, the course
  library `longctx/` read-only, the submission's own folder read-only at /submission, a size-limited
  tmpfs as its home (a copy of the submission; the only place it may write, with /tmp) and nothing else
  of the course: no other submission, no gradebook, no grades.csv, no feedback, no solutions.
- No network: a fresh network namespace has only a loopback interface (used by the kernel's ZeroMQ).
- The executor (nbclient) runs as root inside the sandbox with just CAP_SETUID, CAP_SETGID, CAP_CHOWN;
  the notebook kernel runs as an unprivileged uid with no capabilities, under RLIMIT_AS (memory),
  RLIMIT_NPROC (processes and threads), RLIMIT_CPU (CPU seconds), RLIMIT_FSIZE, no core dumps. Each
  parallel slot leases its own uid (a lock file under /run/lock/longctx-grader), so two `make grade`
  runs at once never share a uid and its process limit.
- Where the machine offers writable cgroup v1 memory/pids/cpu hierarchies, each run also gets a cgroup
  with a hard memory limit, a pids limit and a CPU quota (its share of the cores) covering all of its
  processes together, so one submission cannot starve its neighbours.
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
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_UID = 61000
UID_RANGE = 4000
UID_LOCK_DIR = "/run/lock/longctx-grader"
CGROUP_V1 = "/sys/fs/cgroup"


@dataclass
class Limits:
    wall_s: float = 600.0            # per notebook
    cell_timeout_s: float = 120.0    # per cell
    memory_bytes: int = 4 * 2**30    # address space of the kernel process (RLIMIT_AS) and cgroup limit
    max_processes: int = 256         # processes + threads of the sandbox user (RLIMIT_NPROC)
    max_file_bytes: int = 256 * 2**20
    tmpfs_bytes: int = 512 * 2**20   # home and /tmp, each
    max_cell_output_chars: int = 200_000   # every kind of output (streams, displays, errors)
    threads: int = 1                 # OMP / MKL / torch threads, and the CPU quota in cores
    call_timeout_s: float = 20.0     # one call of the student's code made by a checker
    test_timeout_s: float = 300.0    # one test cell's checker, all its calls included
    python_warnings: str = "ignore"  # PYTHONWARNINGS in the kernel; "default" shows them (the course's own tests)


@dataclass
class RunResult:
    state: str                       # finished | timeout | kernel_died | error | sandbox_failed
    detail: str = ""
    cells_done: int = 0
    failed_cell: int | None = None
    timeouts: list = field(default_factory=list)
    truncated_cells: list = field(default_factory=list)
    kernel_exit: int | None = None
    process_limit_cells: list = field(default_factory=list)
    elapsed_s: float = 0.0
    sandbox_log: str = ""
    oom_killed: bool = False


def model_cache_dir() -> str:
    """longctx's model cache (longctx.model.weights.cache_dir): $LONGCTX_CACHE_DIR or ~/.cache/longctx."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LONGCTX_CACHE_DIR") or "~/.cache/longctx"))


def venv_python() -> str:
    return sys.executable


def check() -> list[str]:
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
    probe = subprocess.run(["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                            "--proc", "/proc", "--dev", "/dev", "--", "/bin/true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        problems.append("bubblewrap is installed but cannot create namespaces here "
                        f"({probe.stderr.strip() or probe.returncode}); a container needs to allow "
                        "unshare/mount (e.g. docker --privileged or --security-opt seccomp=unconfined)")
    return problems


def _cgroup_v1_available() -> bool:
    return all(os.access(os.path.join(CGROUP_V1, c), os.W_OK) for c in ("memory", "pids"))


class UidLease:
    """An unprivileged uid held for one parallel slot of one grading run (a flock'd file per uid).

    Skips uids that belong to a user of this machine; released by `release()` or when the process ends.
    """

    def __init__(self):
        os.makedirs(UID_LOCK_DIR, mode=0o700, exist_ok=True)
        for uid in range(BASE_UID, BASE_UID + UID_RANGE):
            try:
                pwd.getpwuid(uid)
                continue  # a real user: never borrow it
            except KeyError:
                pass
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


class _Cgroup:
    """A per-run cgroup (v1 memory + pids) where the machine allows it; otherwise does nothing."""

    def __init__(self, name: str, limits: Limits):
        self.paths = []
        if not _cgroup_v1_available():
            return
        try:
            mem = os.path.join(CGROUP_V1, "memory", name)
            pids = os.path.join(CGROUP_V1, "pids", name)
            os.makedirs(mem, exist_ok=True)
            os.makedirs(pids, exist_ok=True)
            self.paths = [mem, pids]
            cpu = os.path.join(CGROUP_V1, "cpu", name)
            if os.access(os.path.join(CGROUP_V1, "cpu"), os.W_OK):
                try:
                    os.makedirs(cpu, exist_ok=True)
                    self.paths.append(cpu)
                    _write(os.path.join(cpu, "cpu.cfs_period_us"), "100000")
                    _write(os.path.join(cpu, "cpu.cfs_quota_us"), str(int(max(1, limits.threads) * 100000)))
                except OSError:
                    pass
            _write(os.path.join(mem, "memory.limit_in_bytes"), str(limits.memory_bytes + limits.tmpfs_bytes * 2
                                                                 + 512 * 2**20))
            _write_try(os.path.join(mem, "memory.memsw.limit_in_bytes"),
                       str(limits.memory_bytes + limits.tmpfs_bytes * 2 + 512 * 2**20))
            _write(os.path.join(pids, "pids.max"), str(limits.max_processes + 64))
        except OSError:
            self.remove()
            self.paths = []

    def enter(self):  # runs in the child before exec
        for path in self.paths:
            _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))

    def oom_killed(self) -> bool:
        for path in self.paths:
            try:
                with open(os.path.join(path, "memory.oom_control")) as fh:
                    for line in fh:
                        if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                            return True
                with open(os.path.join(path, "memory.failcnt")) as fh:
                    if int(fh.read().strip() or 0) > 0:
                        return True
            except (OSError, ValueError):
                continue
        return False

    def remove(self):
        for path in self.paths:
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _write_try(path, text):
    try:
        _write(path, text)
    except OSError:
        pass


def _bind_system() -> list[str]:
    args = []
    for path in ("/usr", "/etc"):
        args += ["--ro-bind", path, path]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _bind_python() -> list[str]:
    """The Python installation and the virtual environment, read-only, at their own paths.

    Bound after the private /tmp and home tmpfs mounts, so that a course cloned under /tmp (as CI
    does) still sees its .venv inside the sandbox.
    """
    args = []
    seen = set()
    for prefix in (sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix, os.path.realpath(sys.base_prefix),
                   os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
        if prefix in seen or prefix == "/usr" or prefix.startswith("/usr/") or prefix == "/":
            continue
        seen.add(prefix)
        args += ["--ro-bind", prefix, prefix]
    return args


def build_command(*, course_root: str, ctl_dir: str, submission_dir: str, limits: Limits,
                  extra_ro: list[str] | None = None) -> list[str]:
    py = venv_python()
    lib = os.path.join(course_root, "longctx")
    env = {
        "HOME": "/home/student", "PATH": f"{os.path.dirname(py)}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": course_root, "PYTHONWARNINGS": limits.python_warnings, "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "LANG": "C.UTF-8", "TERM": "dumb",
        "JUPYTER_PATH": "/ctl/share/jupyter", "JUPYTER_RUNTIME_DIR": "/run/jupyter",
        "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": "/home/student/.ipython",
        "OMP_NUM_THREADS": str(limits.threads), "MKL_NUM_THREADS": str(limits.threads),
        "OPENBLAS_NUM_THREADS": str(limits.threads), "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NBGRADER_EXECUTION": "autograde",
    }
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grader",
           "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_CHOWN",
           "--cap-add", "CAP_KILL",
           *_bind_system(),
           "--proc", "/proc", "--dev", "/dev",
           "--perms", "1777", "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
           "--size", str(limits.tmpfs_bytes), "--tmpfs", "/home/student",
           "--tmpfs", "/run",
           *_bind_python(),
           "--ro-bind", lib, lib,
           "--ro-bind", os.path.join(HERE, "executor.py"), "/opt/grader/executor.py",
           "--ro-bind", os.path.join(HERE, "kernel_launch.py"), "/opt/grader/kernel_launch.py",
           "--ro-bind", os.path.join(HERE, "plaindata.py"), "/opt/grader/plaindata.py",
           "--bind", ctl_dir, "/ctl",
           "--ro-bind", submission_dir, "/submission"]
    for path in extra_ro or []:
        if os.path.exists(path):
            cmd += ["--ro-bind", path, path]
    cache = model_cache_dir()
    if os.path.isdir(cache):  # the dequantized model, read-only, where longctx looks for it
        cmd += ["--ro-bind", cache, cache]
        env["LONGCTX_CACHE_DIR"] = cache
    cmd += ["--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    cmd += ["--chdir", "/", "--", py, "/opt/grader/executor.py"]
    return _with_parent_dirs(cmd)


def _with_parent_dirs(cmd: list[str]) -> list[str]:
    """bwrap creates missing parents of a mount point as 0700 root: create them 0755 just before."""
    two_arg = {"--ro-bind", "--bind", "--symlink", "--ro-bind-try", "--bind-try"}
    one_arg = {"--tmpfs", "--proc", "--dev", "--dir"}
    out, pending, i, made = [], [], 0, set()
    while i < len(cmd) and cmd[i] != "--":
        arg = cmd[i]
        if arg in ("--perms", "--size"):  # modifiers of the next mount
            pending += cmd[i:i + 2]
            i += 2
            continue
        n = 3 if arg in two_arg else 2 if arg in one_arg else 0
        if not n:
            out.append(arg)
            i += 1
            continue
        dest = cmd[i + n - 1]
        parents, parent = [], os.path.dirname(dest)
        while parent not in ("/", ""):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for parent in reversed(parents):
            if parent not in made:
                out += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        if arg == "--tmpfs":  # a tmpfs hides what was made below it
            made = {m for m in made if not m.startswith(dest + "/")}
        out += pending + cmd[i:i + n]
        pending = []
        i += n
    return out + cmd[i:]


def write_kernelspec(ctl_dir: str):
    spec_dir = os.path.join(ctl_dir, "share", "jupyter", "kernels", "lcgrader")
    os.makedirs(spec_dir, exist_ok=True)
    spec = {"argv": [venv_python(), "/opt/grader/kernel_launch.py", "{connection_file}"],
            "display_name": "Python 3 (grader sandbox)", "language": "python"}
    with open(os.path.join(spec_dir, "kernel.json"), "w") as fh:
        json.dump(spec, fh)


def run(*, course_root: str, ctl_dir: str, submission_dir: str, uid: int, limits: Limits,
        test_cells: list[int] | None = None, extra_ro: list[str] | None = None) -> RunResult:
    """Execute ctl_dir/input.ipynb in a sandbox; results land in ctl_dir (executed.ipynb, status.json).

    At each cell index in `test_cells` the executor asks the grader, over ctl_dir/grader.sock (which the
    caller listens on), to check that test, and relays the checker's plain-data requests to the kernel.
    """
    os.makedirs(ctl_dir, exist_ok=True)
    os.chmod(ctl_dir, 0o700)
    for name in ("executed.ipynb", "status.json"):
        if os.path.exists(os.path.join(ctl_dir, name)):
            os.remove(os.path.join(ctl_dir, name))
    job = {"uid": uid, "gid": uid, "deadline_s": limits.wall_s,
           "cell_timeout_s": limits.cell_timeout_s, "max_cell_output_chars": limits.max_cell_output_chars,
           "memory_bytes": limits.memory_bytes, "cpu_s": int(limits.wall_s * max(1, limits.threads)) + 60,
           "max_processes": limits.max_processes, "max_file_bytes": limits.max_file_bytes,
           "test_cells": sorted(test_cells or []), "socket": "/ctl/grader.sock",
           "call_timeout_s": limits.call_timeout_s}
    with open(os.path.join(ctl_dir, "job.json"), "w") as fh:
        json.dump(job, fh)
    write_kernelspec(ctl_dir)
    cmd = build_command(course_root=course_root, ctl_dir=ctl_dir, submission_dir=submission_dir,
                        limits=limits, extra_ro=extra_ro)
    cgroup = _Cgroup(f"longctx-grader-{os.getpid()}-{uid}", limits)
    start = time.monotonic()
    log = _CappedLog()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=cgroup.enter if cgroup.paths else None)
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
    oom = cgroup.oom_killed()
    cgroup.remove()
    status = _read_status(os.path.join(ctl_dir, "status.json"))
    result = RunResult(state=status.get("state", "sandbox_failed"), detail=status.get("detail", ""),
                       cells_done=status.get("cells_done", 0), failed_cell=status.get("failed_cell"),
                       timeouts=status.get("timeouts", []), truncated_cells=status.get("truncated_cells", []),
                       kernel_exit=status.get("kernel_exit"),
                       process_limit_cells=status.get("process_limit_cells", []), elapsed_s=round(elapsed, 1),
                       sandbox_log=log.text(), oom_killed=oom)
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
    import signal
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
