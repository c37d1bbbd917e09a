"""Total memory, process and CPU limits for each sandbox and for the checker children, in cgroups v1 or v2.

`detect()` says whether this machine lets the grader limit a group of processes together, and how:

- **v1**: writable `memory`, `pids` and `cpu` hierarchies under /sys/fs/cgroup: a cgroup per run in each
  (memory.limit_in_bytes + memory.memsw.limit_in_bytes, pids.max, cpu.cfs_quota_us). Kernel memory
  (slab, page tables, pipe buffers) is charged to memory.limit_in_bytes as on v2, but v1 keeps TCP
  buffers in a counter of their own that it only enforces once `memory.kmem.tcp.limit_in_bytes` is
  written: the grader writes it (`socket_bytes`, 64 MiB per run) before any process joins, so a
  submission's loopback connections cannot buffer the host's `tcp_mem` away. A v1 host without that
  file (a kernel built without it) is refused: its sockets would be charged to nobody.
- **v2**: a cgroup2 mount (/sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid hosts) and a *delegated*
  cgroup whose `memory`, `pids` and `cpu` controllers the grader may hand to children (memory.max,
  memory.swap.max = 0, pids.max, cpu.max). v2 charges socket buffers and kernel memory to memory.max
  itself, so `socket_bytes` needs no file of its own there. v2 forbids processes in a cgroup that hands
  controllers to children, so the grader uses, in this order:
    1. `$LONGCTX_GRADER_CGROUP`: an empty cgroup made for it (e.g. by the machine's administrator);
    2. the hierarchy's root cgroup, when the grader runs there (a machine without systemd, or a
       container that shares the host's cgroups): `<root>/longctx-grader`;
    3. its own cgroup, when the grader is its only process (`sudo systemd-run --scope -p Delegate=yes
       -- .venv/bin/python autograder/grade.py`): it moves itself into the leaf `<own>/grader` first.
- a kernel booted with `cgroup.memory=nosocket` or `nokmem` (socket or kernel memory charged to no cgroup,
  v1 or v2) is refused, like a v1 host without the TCP limit file;
- otherwise `kind` is None and `problem` says why; `make grade` then refuses to grade (sandbox.check).

`detect` only reads; `CgroupHost.activate()` makes the changes (moves the grader, enables controllers)
once the grader has decided to grade. Tests point `detect` at a fake root and a fake /proc/self/cgroup.
"""

from __future__ import annotations

import itertools
import os
import resource
import time
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"
KERNEL_CMDLINE = "/proc/cmdline"
NEEDED_V2 = ("cpu", "memory", "pids")
SOCKET_BYTES = 64 * 2**20   # v1: TCP buffers of one cgroup (v2 counts them in memory.max)
_COUNTER = itertools.count()


@dataclass
class CgroupHost:
    kind: str | None          # "v1", "v2" or None
    root: str = ""            # v1: the folder of the hierarchies; v2: the cgroup2 mount
    base: str = ""            # v2: the delegated cgroup whose children the grader creates
    problem: str = ""         # why there are no cgroup limits (kind None)
    move_self: bool = False   # v2, case 3: move this process into <base>/grader first

    def activate(self):
        """Make the v2 subtree usable (enable the controllers; move the grader into its leaf). Idempotent."""
        if self.kind != "v2":
            return
        enable = " ".join("+" + c for c in NEEDED_V2)
        if self.move_self:
            leaf = os.path.join(self.base, "grader")
            os.makedirs(leaf, exist_ok=True)
            _write(os.path.join(leaf, "cgroup.procs"), str(os.getpid()))
            self.move_self = False
        # case 2: the root hands the controllers down
        if os.path.dirname(self.base.rstrip("/")) == self.root.rstrip("/") and \
                os.path.basename(self.base) == "longctx-grader":
            _write(os.path.join(self.root, "cgroup.subtree_control"), enable)
            os.makedirs(self.base, exist_ok=True)
        _write(os.path.join(self.base, "cgroup.subtree_control"), enable)


def _read(path, default=""):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return default


def _write(path, text):
    with open(path, "w") as fh:
        fh.write(text)


def _write_try(path, text):
    try:
        _write(path, text)
    except OSError:
        pass


def _own_v2_path(proc_cgroup):
    for line in _read(proc_cgroup).splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _v1_ok(root):
    return all(os.access(os.path.join(root, c), os.W_OK) and
               os.path.isdir(os.path.join(root, c)) for c in ("memory", "pids", "cpu"))


def _v1_tcp_file(root):
    return os.path.join(root, "memory", "memory.kmem.tcp.limit_in_bytes")


def _controllers(path):
    return set(_read(os.path.join(path, "cgroup.controllers")).split())


def _accounting_off(cmdline) -> list[str]:
    """The memory controller's accounting switched off at boot (`cgroup.memory=nosocket,nokmem`)."""
    words = _read(cmdline).split()
    options = {o for w in words if w.startswith("cgroup.memory=") for o in w.split("=", 1)[1].split(",")}
    return sorted(options & {"nosocket", "nokmem"})


def detect(root=None, proc_cgroup=None, env=None, cmdline=None) -> CgroupHost:
    """Which cgroups the grader can use here (reads only; see the module docstring). The defaults are the
    module's CGROUP_ROOT, PROC_SELF_CGROUP, KERNEL_CMDLINE and os.environ, read at each call."""
    root = root or CGROUP_ROOT
    proc_cgroup = proc_cgroup or PROC_SELF_CGROUP
    env = os.environ if env is None else env
    off = _accounting_off(cmdline or KERNEL_CMDLINE)
    if off:
        return CgroupHost(None, problem=f"this kernel was booted with cgroup.memory={','.join(off)}: socket "
                                        "buffers or kernel memory are charged to no cgroup, so a submission "
                                        "could take the host's memory past its limit (boot without that "
                                        "option)")
    if _v1_ok(root):
        if not os.path.isfile(_v1_tcp_file(root)):
            return CgroupHost(None, problem=f"cgroup v1 at {root} has no memory.kmem.tcp.limit_in_bytes: a "
                                            "submission's TCP buffers would be charged to no cgroup (use "
                                            "cgroup v2, or a kernel with v1 kernel-memory accounting)")
        return CgroupHost("v1", root=root)
    for mount in (root, os.path.join(root, "unified")):
        if os.path.isfile(os.path.join(mount, "cgroup.controllers")):
            return _detect_v2(mount, proc_cgroup, env)
    return CgroupHost(None, problem=f"no cgroup hierarchy the grader can write at {root} (neither v1 "
                                    "memory, pids and cpu nor cgroup v2): a submission's processes together "
                                    "could use all the machine's memory and CPU")


def _detect_v2(mount, proc_cgroup, env):
    missing = [c for c in NEEDED_V2 if c not in _controllers(mount)]
    if missing:
        return CgroupHost(None, problem=f"cgroup v2 at {mount} offers no {', '.join(missing)} "
                                        "controller(s), so the grader cannot limit a submission's memory, "
                                        "processes and CPU")
    if not os.access(mount, os.W_OK):
        return CgroupHost(None, problem=f"cgroup v2 at {mount} is not writable (run as root, outside a "
                                        "read-only container mount)")
    delegated = env.get("LONGCTX_GRADER_CGROUP", "")
    if delegated:
        base = os.path.abspath(delegated)
        if not base.startswith(mount.rstrip("/") + "/") or not os.path.isdir(base):
            return CgroupHost(None,
                              problem=f"LONGCTX_GRADER_CGROUP={delegated} is not a cgroup under {mount}")
        why = _unusable(base)
        return CgroupHost(None, problem=f"LONGCTX_GRADER_CGROUP={delegated}: {why}") if why else \
            CgroupHost("v2", root=mount, base=base)
    own = _own_v2_path(proc_cgroup)
    if own == "/":
        return CgroupHost("v2", root=mount, base=os.path.join(mount, "longctx-grader"))
    if own:
        path = os.path.join(mount, own.lstrip("/"))
        procs = set(_read(os.path.join(path, "cgroup.procs")).split())
        if procs == {str(os.getpid())} and not _unusable(path, empty=False):
            return CgroupHost("v2", root=mount, base=path, move_self=True)
    return CgroupHost(None, problem=(
        f"cgroup v2: the grader's cgroup ({own or '?'}) has other processes, so it cannot hand memory, "
        "pids and cpu limits to a cgroup per submission. Run the grader alone in a delegated scope: "
        "`sudo systemd-run --scope -p Delegate=yes -- .venv/bin/python autograder/grade.py`, or set "
        "LONGCTX_GRADER_CGROUP to an empty cgroup delegated to it"))


def _unusable(path, empty=True):
    """Why `path` cannot be the grader's delegated cgroup ('' if it can)."""
    missing = [c for c in NEEDED_V2 if c not in _controllers(path)]
    if missing:
        return f"the parent cgroup does not hand down the {', '.join(missing)} controller(s)"
    if not os.access(path, os.W_OK):
        return "not writable by the grader"
    if empty and _read(os.path.join(path, "cgroup.procs")).split():
        return "it has processes (a cgroup that hands controllers to children must have none)"
    return ""


class Cgroup:
    """One group of processes limited together: memory (no swap beyond it, socket buffers included),
    processes, CPU cores. `socket_bytes`: v1's separate cap on TCP buffers (v2 counts them in memory.max)."""

    def __init__(self, host: CgroupHost, name: str, memory_bytes: int, max_pids: int, cpus: float,
                 socket_bytes: int = SOCKET_BYTES):
        self.host, self.paths = host, []
        name = f"{name}-{os.getpid()}-{next(_COUNTER)}"
        quota_us = str(int(max(0.1, cpus) * 100_000))
        try:
            if host.kind == "v1":
                for controller in ("memory", "pids", "cpu"):
                    path = os.path.join(host.root, controller, name)
                    os.makedirs(path, exist_ok=True)
                    self.paths.append(path)
                mem, pids, cpu = self.paths
                _write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_bytes))
                _write_try(os.path.join(mem, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                _write(os.path.join(mem, "memory.kmem.tcp.limit_in_bytes"),
                       str(min(socket_bytes, memory_bytes)))
                _write(os.path.join(pids, "pids.max"), str(max_pids))
                _write(os.path.join(cpu, "cpu.cfs_period_us"), "100000")
                _write(os.path.join(cpu, "cpu.cfs_quota_us"), quota_us)
            elif host.kind == "v2":
                path = os.path.join(host.base, name)
                os.makedirs(path, exist_ok=True)
                self.paths.append(path)
                _write(os.path.join(path, "memory.max"), str(memory_bytes))
                _write_try(os.path.join(path, "memory.swap.max"), "0")  # absent without swap accounting
                _write(os.path.join(path, "pids.max"), str(max_pids))
                _write(os.path.join(path, "cpu.max"), f"{quota_us} 100000")
        except OSError:
            self.remove()
            raise

    def procs_files(self) -> list[str]:
        return [os.path.join(p, "cgroup.procs") for p in self.paths]

    def enter(self):
        """Move the calling process into the group (runs in the child before exec: no Python allocations)."""
        for path in self.procs_files():
            _write(path, str(os.getpid()))

    def oom_killed(self) -> bool:
        for path in self.paths:
            events = (_read(os.path.join(path, "memory.events"))
                      + _read(os.path.join(path, "memory.oom_control")))
            for line in events.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    return True
            if _read(os.path.join(path, "memory.failcnt")).strip() not in ("", "0"):
                return True
        return False

    def remove(self):
        for path in self.paths:
            if os.path.exists(os.path.join(path, "cgroup.kill")):  # v2 (Linux >= 5.14): stragglers die first
                _write_try(os.path.join(path, "cgroup.kill"), "1")
            for _ in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        self.paths = []


def enter_files(paths):
    """Move the calling process into the cgroups whose cgroup.procs files are `paths` (checker children)."""
    for path in paths:
        _write(path, str(os.getpid()))


def limit_process(limits):
    """Limit the calling process (a checker child, a notebook validator) before it reads any student data.

    limits: {"cgroup_procs": [cgroup.procs files to join], "cpu_s": CPU seconds (RLIMIT_CPU),
    "memory_bytes": address space beyond what the process already maps (RLIMIT_AS)}.
    """
    if not limits:
        return
    enter_files(limits.get("cgroup_procs", []))
    cpu_s = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU at the CPU limit must not write a core file
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + int(limits["memory_bytes"]),) * 2)
