"""The bubblewrap command line of one sandbox (autograder/sandbox.py runs it).

The view it builds: /usr, /etc and the Python installation read-only; the virtual environment read-only
at /opt/venv, the course library `longctx/` at /opt/course/longctx and the model cache at /opt/model-cache
(fixed paths: no command line or environment inside names the host's folders); the grader's sandbox-side
files read-only at /opt/grader; the submission read-only at /submission; size-limited tmpfs mounts at
/tmp, /home/student and /run; the run's control folder at /ctl; a private /proc whose /proc/sys is
read-only (bwrap 0.8 leaves it writable); bwrap's minimal /dev. Nothing else of the host or the course.

bwrap reads its options from a memfd (`--args FD`, `options_fd`): the sandbox's /proc/1 (bwrap's own
process) then shows `bwrap --args N -- python /opt/grader/sandbox_init.py`, not the host paths of the
run's control folder, the staged submission or the course.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# every file the sandbox runs: sandbox_init.py (root, first), executor.py (its own uid), kernel_launch.py
SANDBOX_FILES = ("sandbox_init.py", "caps.py", "executor.py", "executor_output.py", "grader_link.py",
                 "kernel_launch.py", "plaindata.py", "plainserve.py")
RUN_TMPFS_BYTES = 64 * 2**20     # /run: the kernel's connection file and the checker's requests (<= 8 MiB)


def model_cache_dir() -> str:
    """longctx's model cache (longctx.model.weights.cache_dir): $LONGCTX_CACHE_DIR or ~/.cache/longctx."""
    return os.path.abspath(os.path.expanduser(os.environ.get("LONGCTX_CACHE_DIR") or "~/.cache/longctx"))


VENV = "/opt/venv"             # the grader's virtual environment, inside the sandbox
COURSE = "/opt/course"         # holds the course library, longctx/ (PYTHONPATH)
MODEL_CACHE = "/opt/model-cache"


def _in_venv() -> bool:
    return sys.prefix != sys.base_prefix


def venv_python() -> str:
    """The interpreter the sandbox runs: the virtual environment's, at /opt/venv (it finds its pyvenv.cfg
    next to the path it was started by, so the environment works there), or the plain installation's."""
    if _in_venv():
        return os.path.join(VENV, os.path.relpath(sys.executable, sys.prefix))
    return sys.executable


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
    """The Python installation read-only at its own path (the environment's links point into it), and the
    virtual environment read-only at /opt/venv, so that no process's command line names the course's folder.

    Bound after the private /tmp and home tmpfs mounts, so that a Python installed under /tmp still shows.
    """
    args = ["--ro-bind", sys.prefix, VENV] if _in_venv() else []
    seen = {sys.prefix} if _in_venv() else set()
    for prefix in (sys.prefix, os.path.realpath(sys.prefix), sys.base_prefix,
                   os.path.realpath(sys.base_prefix),
                   os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))):
        if prefix in seen or prefix == "/usr" or prefix.startswith("/usr/") or prefix == "/":
            continue
        seen.add(prefix)
        args += ["--ro-bind", prefix, prefix]
    return args


def sandbox_env(limits) -> dict:
    py = venv_python()
    threads = str(limits.threads)
    return {
        "HOME": "/home/student", "PATH": f"{os.path.dirname(py)}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": COURSE, "PYTHONWARNINGS": limits.python_warnings, "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "LANG": "C.UTF-8", "TERM": "dumb",
        "JUPYTER_PATH": "/ctl/share/jupyter", "JUPYTER_RUNTIME_DIR": "/run/jupyter",
        "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": "/home/student/.ipython",
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "NBGRADER_EXECUTION": "autograde",
    }


def build_command(*, course_root: str, ctl_dir: str, submission_dir: str, limits,
                  extra_ro: list[str] | None = None, seccomp_fd: int | None = None) -> list[str]:
    py = venv_python()
    lib = os.path.join(course_root, "longctx")
    env = sandbox_env(limits)
    cmd = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
           "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grader",
           "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
           "--cap-add", "CAP_CHOWN", "--cap-add", "CAP_KILL",
           *_bind_system(),
           "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev",
           "--perms", "1777", "--size", str(limits.tmpfs_bytes), "--tmpfs", "/tmp",
           "--size", str(limits.tmpfs_bytes), "--tmpfs", "/home/student",
           "--perms", "0755", "--size", str(RUN_TMPFS_BYTES), "--tmpfs", "/run",
           *_bind_python(),
           "--ro-bind", lib, f"{COURSE}/longctx"]
    for name in SANDBOX_FILES:
        cmd += ["--ro-bind", os.path.join(HERE, name), f"/opt/grader/{name}"]
    cmd += ["--bind", ctl_dir, "/ctl", "--ro-bind", submission_dir, "/submission"]
    for path in extra_ro or []:
        if os.path.exists(path):
            cmd += ["--ro-bind", path, path]
    cache = model_cache_dir()
    if os.path.isdir(cache):  # the dequantized model, read-only, where longctx looks for it
        cmd += ["--ro-bind", cache, MODEL_CACHE]
        env["LONGCTX_CACHE_DIR"] = MODEL_CACHE
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    cmd += ["--clearenv"]
    for key, value in env.items():
        cmd += ["--setenv", key, value]
    cmd += ["--chdir", "/", "--", py, "/opt/grader/sandbox_init.py"]
    return _with_parent_dirs(cmd)


def options_fd(cmd: list[str]) -> tuple[int, list[str]]:
    """(fd, short command): bwrap's options (everything before `--`) moved into a memfd that bwrap reads with
    `--args FD`. The fd is close-on-exec here; the caller passes it to bwrap (pass_fds) and closes it
    after."""
    split = cmd.index("--")
    data = b"".join(arg.encode("utf-8", "surrogateescape") + b"\0" for arg in cmd[1:split])
    fd = os.memfd_create("bwrap-options")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd, [cmd[0], "--args", str(fd), *cmd[split:]]


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
            if parent not in made and not (parent == "/proc" or parent.startswith("/proc/")):
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
