"""The grader's handle on the bookkeeping worker (autograder/bookkeeper.py): one task at a time, each with a
time limit; a worker that overruns is stopped and the next task starts a fresh one.

A worker reads what the student's notebook produced (nbgrader's autograde, the feedback page), so it is
limited like a sandbox: its own cgroup (`WORKER_MEMORY_BYTES` of memory without swap, 64 processes, one
core of CPU; cgroup v1 or v2, autograder/cgroups.py) and RLIMIT_AS (`WORKER_ADDRESS_BYTES`). Without
cgroups (`--allow-no-cgroups`) only RLIMIT_AS holds, and the grader says so when it starts.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import subprocess
import sys
import threading

import cgroups

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER_MEMORY_BYTES = 2 * 2**30    # a worker's cgroup (resident memory, kernel memory included)
WORKER_ADDRESS_BYTES = 4 * 2**30   # a worker's RLIMIT_AS (address space: above its resident memory)
WORKER_PIDS = 64
WORKER_CPUS = 1.0


class Bookkeeper:
    """nbgrader's autograde / feedback / export in a worker process, each task with a time limit."""

    def __init__(self, root, work, cgroup_host=None, name="bookkeeper"):
        """`cgroup_host`: where to make the worker's cgroup (None: RLIMIT_AS only, see `limits_note`)."""
        self.root, self.work, self.proc = root, work, None
        self._replies = queue.Queue()
        self._lock = threading.Lock()
        self.cgroup, self.problem = None, "--allow-no-cgroups"
        if cgroup_host is not None and cgroup_host.kind:
            try:
                self.cgroup = cgroups.Cgroup(cgroup_host, f"longctx-grader-{name}", WORKER_MEMORY_BYTES,
                                             WORKER_PIDS, WORKER_CPUS)
            except OSError as exc:
                self.problem = f"its cgroup could not be made: {exc}"

    def limits_note(self) -> str:
        """What limits the worker (one line for the grader's log)."""
        if self.cgroup is not None:
            return (f"cgroup {self.cgroup.host.kind}: {WORKER_MEMORY_BYTES // 2**30} GiB, {WORKER_PIDS} "
                    f"processes, {WORKER_CPUS:g} core; RLIMIT_AS {WORKER_ADDRESS_BYTES // 2**30} GiB")
        return (f"NO CGROUP: only RLIMIT_AS {WORKER_ADDRESS_BYTES // 2**30} GiB per process, no CPU quota "
                f"({self.problem})")

    def _limit_child(self):
        """In the worker, before exec (no Python allocations to speak of): its cgroup and address space."""
        if self.cgroup is not None:
            self.cgroup.enter()
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_ADDRESS_BYTES, WORKER_ADDRESS_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def _start(self):
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "bookkeeper.py"), self.root,
                                      self.work],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, text=True, encoding="utf-8", errors="replace",
                                     preexec_fn=self._limit_child)
        self._replies = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._replies), daemon=True).start()
        ready = self._get(120)
        if not ready or not ready.get("ready"):
            raise RuntimeError("the bookkeeping worker did not start")

    @staticmethod
    def _read(proc, replies):
        for line in proc.stdout:
            try:
                replies.put(json.loads(line))
            except ValueError:
                continue
        replies.put(None)

    def _get(self, timeout):
        try:
            return self._replies.get(timeout=timeout)
        except queue.Empty:
            return None

    def ask(self, task, timeout):
        """The worker's answer, or {"ok": False, "error": ...} after `timeout` s (the worker is then
        restarted)."""
        with self._lock:
            return self._ask(task, timeout)

    def _ask(self, task, timeout):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write(json.dumps(task, ensure_ascii=True) + "\n")
            self.proc.stdin.flush()
        except OSError:
            self.close()
            return {"ok": False, "error": "the bookkeeping worker stopped"}
        reply = self._get(timeout)
        if reply is None:
            exited = self.proc.poll() is not None
            oom = exited and self.cgroup is not None and self.cgroup.oom_killed()
            self.close()
            if exited:
                return {"ok": False, "error": "the bookkeeping worker stopped" +
                        (" (it reached its memory limit)" if oom else " (out of memory or killed)")}
            return {"ok": False, "error": f"took longer than {timeout:g} s (stopped)"}
        return reply

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                self.proc.kill()
            except OSError:
                pass
            self.proc.wait(timeout=30)
            self.proc = None

    def remove(self):
        """Stop the worker and remove its cgroup (at the end of the run)."""
        self.close()
        if self.cgroup is not None:
            self.cgroup.remove()
