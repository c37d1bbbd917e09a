"""Binder's limits for ``scripts/binder_check.py``: a cgroup (memory limit and CPU quota, v1 or v2) per
run, pinned to one core, in a network namespace with only loopback; ``run_limited`` runs a command so and
measures its wall time, the cgroup's peak, the process tree's peak resident memory and OOM kills.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MEMORY_LIMIT_BYTES = 2 * 2**30    # Binder: 2 GiB ("2 GB" in its docs; the limit is 2048 MiB)
CPU_LIMIT = 1.0                   # Binder: 1 CPU guaranteed
CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_V2 = Path("/sys/fs/cgroup/unified")


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
